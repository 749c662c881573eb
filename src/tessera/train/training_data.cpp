#include "tessera/train/training_data.h"

#include "tessera/core/log.h"

namespace tessera {

DatasetSamples::DatasetSamples(std::shared_ptr<const data::SampleDataset> dataset, int32_t vocab_modulo)
    : dataset_(std::move(dataset)), vocab_modulo_(vocab_modulo) {}

void DatasetSamples::fill(int64_t index, int32_t* tokens) {
  const int64_t n = dataset_->sequence_length() + 1;
  dataset_->sample(index, {tokens, static_cast<size_t>(n)});
  if (vocab_modulo_ > 0)
    for (int64_t i = 0; i < n; ++i) tokens[i] %= vocab_modulo_;
}

TrainingData build_training_data(const TrainArgs& args) {
  const data::TokenizerIdentity identity =
      args.tokenizer.type == "NullTokenizer"
          ? data::null_tokenizer_identity(*args.tokenizer.vocab_size)
          : data::gpt2_bpe_tokenizer_identity(args.tokenizer.vocab_file, args.tokenizer.merge_file);
  const data::GPTDatasetConfig config = data::make_gpt_dataset_config(args.data, identity, args.eod);
  const data::SplitSizes sizes = data::requested_sample_counts(args.train_iters, args.train_samples,
                                                               args.global_batch_size, args.eval_interval,
                                                               args.eval_iters);
  print_rank_0("%s", data::format_target_sizes(sizes).c_str());
  data::GPTDatasets datasets = data::build_gpt_datasets(config, sizes);
  // Megatron's mock documents count up to 4095; a real dataset's ids come from the same
  // tokenizer as the model and are used as they are.
  const int32_t modulo = args.data.mock_data && args.model.vocab_size < 4096 ? args.model.vocab_size : 0;
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

}  // namespace tessera
