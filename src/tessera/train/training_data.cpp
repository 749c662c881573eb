#include "tessera/train/training_data.h"

#include <unistd.h>

#include <algorithm>
#include <array>
#include <cstring>

#include "tessera/ckpt/checkpoint.h"
#include "tessera/core/error.h"
#include "tessera/core/log.h"
#include "tessera/data/gpt_dataset_mock.h"
#include "tessera/data/token_id_range.h"

namespace tessera {

DatasetSamples::DatasetSamples(std::shared_ptr<const data::SampleDataset> dataset, int32_t vocab_modulo)
    : dataset_(std::move(dataset)), vocab_modulo_(vocab_modulo) {}

void DatasetSamples::fill(int64_t index, int32_t* tokens) {
  const int64_t n = dataset_->sequence_length() + 1;
  dataset_->sample(index, {tokens, static_cast<size_t>(n)});
  if (vocab_modulo_ > 0)
    for (int64_t i = 0; i < n; ++i) tokens[i] %= vocab_modulo_;
}

namespace {

// Before any index is built: an id the embedding cannot hold would abort the first step.
void check_vocabulary_holds_data(const TrainArgs& args, const data::GPTDatasetConfig& config) {
  const GPTConfig& m = args.model;
  const std::vector<data::TokenIdRange> ranges = data::check_token_ids_fit(
      config, m.padded_vocab_size, data::describe_vocabulary(args.tokenizer, m.vocab_size, m.padded_vocab_size));
  int64_t largest = -1;
  uint64_t bytes = 0;
  double seconds = 0;
  for (const data::TokenIdRange& r : ranges) {
    if (!r.scanned) continue;
    largest = std::max(largest, r.max_id);
    bytes += r.bytes_read;
    seconds += r.seconds;
  }
  if (ranges.empty()) return;
  if (largest < 0)
    print_rank_0(" > token ids fit the padded vocabulary (%d): the .idx dtypes bound them", m.padded_vocab_size);
  else
    print_rank_0(" > token ids fit the padded vocabulary (%d): largest %lld, %.1f MiB scanned in %.2f s",
                 m.padded_vocab_size, static_cast<long long>(largest), bytes / 1048576.0, seconds);
}

// Megatron's mock documents hold the ids 1 .. 4094 and EOD (MockGPTLowLevelDataset in
// megatron/core/datasets/gpt_dataset.py), which it trains on as they are; so does tessera
// wherever the padded vocabulary holds them. A smaller one (a tiny test model) cannot:
// Megatron would index past its embedding there (an IndexError, or with TP > 1 zero vectors
// from its vocab-parallel embedding), where tessera folds the ids modulo the
// vocabulary (EOD, its last id, stays) and says so. Returns the modulus, 0 for none.
int32_t mock_id_modulus(const TrainArgs& args) {
  constexpr int64_t kLargestMockId = data::MockLowLevelDataset::kMaxSequenceLength - 2;
  const GPTConfig& m = args.model;
  if (!args.data.mock_data || kLargestMockId < m.padded_vocab_size) return 0;
  print_rank_0(" > --mock-data: its ids 1..%lld do not fit the padded vocabulary (%d), so they are taken modulo %d "
               "(Megatron takes them as they are and fails; a padded vocabulary of %lld or more does too)",
               static_cast<long long>(kLargestMockId), m.padded_vocab_size, m.vocab_size,
               static_cast<long long>(kLargestMockId + 1));
  return m.vocab_size;
}

}  // namespace

ResumePosition resume_position(const TrainArgs& args) {
  if (args.load.empty() || args.finetune) return {};
  const std::optional<int64_t> latest = latest_checkpoint_iteration(args.load);
  if (!latest) return {};
  const CheckpointState s = read_checkpoint_metadata(args.load, *latest);
  return {s.iteration, s.consumed_valid_samples};
}

int64_t validation_samples_read(const TrainArgs& args, const ResumePosition& from) {
  const int64_t evaluations = args.train_iters / args.eval_interval - from.iteration / args.eval_interval + 1;
  return from.consumed_valid_samples + evaluations * args.eval_iters * args.global_batch_size;
}

TrainingData build_training_data(const TrainArgs& args, const ResumePosition& from) {
  const data::TokenizerIdentity identity = data::tokenizer_identity(args.tokenizer);
  data::GPTDatasetConfig config = data::make_gpt_dataset_config(args.data, identity, args.eod);
  config.pad_id = args.pad;
  check_vocabulary_holds_data(args, config);
  data::SplitSizes sizes = data::requested_sample_counts(args.train_iters, args.train_samples,
                                                               args.global_batch_size, args.eval_interval,
                                                               args.eval_iters);
  if (const int64_t read = validation_samples_read(args, from); args.eval_iters > 0 && sizes[1] && read > *sizes[1]) {
    print_rank_0(" > validation sized for this resumed run: it reads to sample %lld, past the %lld that --eval-iters "
                 "and --eval-interval give a run from iteration 0 (the checkpoint's run evaluated with others)",
                 static_cast<long long>(read), static_cast<long long>(*sizes[1]));
    sizes[1] = read;
  }
  print_rank_0("%s", data::format_target_sizes(sizes).c_str());
  data::GPTDatasets datasets = data::build_gpt_datasets(config, sizes);
  const int32_t modulo = mock_id_modulus(args);
  TrainingData out;
  auto wrap = [&](const std::shared_ptr<const data::SampleDataset>& d) {
    return d ? std::make_unique<DatasetSamples>(d, modulo) : nullptr;
  };
  out.train = wrap(datasets.train);
  out.valid = wrap(datasets.valid);
  out.test = wrap(datasets.test);
  out.masks = data::ltor_options(config);
  if (!out.train) throw usage_error("the training split is empty", "check --split (its first part must be > 0)");
  return out;
}

void check_datasets_agree(const TrainingData& data, Communicator& world) {
  // One fixed-size record per rank: the host name, then each split's digest ("-" if absent).
  constexpr size_t kField = 72;
  constexpr size_t kRecord = 4 * kField;
  std::array<char, kRecord> mine{};
  gethostname(mine.data(), kField - 1);
  const DatasetSamples* splits[3] = {data.train.get(), data.valid.get(), data.test.get()};
  for (int s = 0; s < 3; ++s) {
    const std::string digest = splits[s] ? splits[s]->index_digest() : "-";
    std::strncpy(mine.data() + (s + 1) * kField, digest.c_str(), kField - 1);
  }
  std::vector<char> all(kRecord * world.size());
  world.all_gather(Tensor(all.data(), DType::U8, {static_cast<int64_t>(all.size())}, nullptr),
                   Tensor(mine.data(), DType::U8, {static_cast<int64_t>(kRecord)}, nullptr));
  static const char* const kSplit[3] = {"train", "validation", "test"};
  std::string mismatches;
  for (int r = 1; r < world.size(); ++r)
    for (int s = 0; s < 3; ++s) {
      const char* ref = all.data() + (s + 1) * kField;
      const char* other = all.data() + r * kRecord + (s + 1) * kField;
      if (std::strncmp(ref, other, kField) != 0)
        mismatches += "\n  rank " + std::to_string(r) + " on " + std::string(all.data() + r * kRecord) + ": " +
                      kSplit[s] + " index " + std::string(other, 12) + "... vs rank 0 on " + std::string(all.data()) +
                      ": " + std::string(ref, 12) + "...";
    }
  if (!mismatches.empty())
    throw runtime_error("the ranks would train on different samples:" + mismatches,
                        "give every node the same .bin/.idx files and flags; delete the nodes' --data-cache-path "
                        "folders to rebuild the index caches");
}

}  // namespace tessera
