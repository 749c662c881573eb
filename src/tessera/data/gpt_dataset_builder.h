// Megatron's BlendedMegatronDatasetBuilder for GPT (blended_megatron_dataset_builder.py at
// core_r0.10.0): the train, valid and test datasets from a GPTDatasetConfig and the requested
// sample counts (megatron/training/training.py).
//
//   mock                 MockGPTDataset per split of the mock low-level dataset (split 1,1,1)
//   one prefix, no weights
//                        one GPTDataset per split, each asked for the split's size
//   several prefixes or weights (same distribution, --data-path)
//                        per prefix one GPTDataset per split, asked for
//                        ceil(size * weight * 1.005) samples (all of one epoch without weights);
//                        per split one BlendedDataset over them of size sum of those (with
//                        weights; --renormalize-blend-weights re-derives the weights from the
//                        per-dataset sizes) or min(size, sum of lengths) weighted by the lengths
//                        (without weights)
//   blend_per_split      the same per split, each prefix's whole dataset being the split
//                        (bookend [0.0, 1.0]); the hashed split and split_matrix are null
// A split whose bookend is absent (e.g. --split 99,1,0 has no test) is null.
//
// Who builds: every process may call this. The first process on a node to need an index
// builds it under a file lock, the others wait and then map it (gpt_dataset_cache.h), so no
// barrier is needed; mock data without --data-cache-path is built in memory by each process.
//
// Trainer sketch:
//   auto cfg = make_gpt_dataset_config(args, gpt2_bpe_tokenizer_identity(vocab, merges), 50256);
//   auto sizes = requested_sample_counts(train_iters, train_samples, gbs, eval_interval, eval_iters);
//   print_rank_0("%s", format_target_sizes(sizes).c_str());
//   GPTDatasets ds = build_gpt_datasets(cfg, sizes);
//   std::vector<int32_t> text(cfg.sequence_length + 1);
//   ds.train->sample(consumed_samples + k, text);          // global sample index
//   make_ltor_sample(text, ltor_options(cfg), sample);      // tokens, labels, loss mask, positions
#pragma once

#include <array>
#include <memory>

#include "tessera/data/blended_dataset.h"
#include "tessera/data/gpt_dataset.h"

namespace tessera::data {

struct GPTDatasets {
  std::shared_ptr<const SampleDataset> train, valid, test;  // null where absent
  const std::shared_ptr<const SampleDataset>& operator[](Split s) const {
    return s == Split::Train ? train : s == Split::Valid ? valid : test;
  }
};

GPTDatasets build_gpt_datasets(const GPTDatasetConfig& config, const SplitSizes& sizes);

// The per-dataset sample counts Megatron asks the mid-level datasets for:
// ceil(target * weight * 1.005) for each (normalised) weight and split.
std::vector<std::array<std::optional<int64_t>, 3>> sizes_per_dataset(const std::vector<double>& normalized_weights,
                                                                     const SplitSizes& sizes);

}  // namespace tessera::data
