// Megatron's BlendedDataset (megatron/core/datasets/blended_dataset.py, helpers.cpp): sample i
// is sample dataset_sample_index[i] of dataset dataset_index[i].
//
//   size given   weights normalised (numpy) and build_blending_indices: for each sample, the
//                dataset with the largest deficit weight * max(i, 1) - drawn so far (first on
//                ties) gives its next sample.
//   size absent  exhaustive: weights are the integer sample counts per dataset and
//                build_exhaustive_blending_indices draws exactly that many from each.
//   dataset_index int16, dataset_sample_index int64; cached as
//   <md5>-BlendedDataset-<split>-{description.txt, dataset_index.npy, dataset_sample_index.npy}
//   only when --data-cache-path is set (as Megatron), with the same lock/side-file checks as
//   the GPT dataset cache (gpt_dataset_cache.h).
// Blending a dataset more often than it has samples is an Error (Megatron's IndexError).
#pragma once

#include <memory>
#include <optional>
#include <vector>

#include "tessera/data/gpt_dataset.h"

namespace tessera::data {

// helpers.cpp build_blending_indices; weights as given (already normalised by the caller).
void build_blending_indices(std::span<int16_t> dataset_index, std::span<int64_t> dataset_sample_index,
                            std::span<const double> weights, int64_t size);
// helpers.cpp build_exhaustive_blending_indices; outputs hold sum(sizes) entries.
void build_exhaustive_blending_indices(std::span<int16_t> dataset_index, std::span<int64_t> dataset_sample_index,
                                       std::span<const int64_t> sizes);

class BlendedDataset final : public SampleDataset {
 public:
  // With `size`: `weights` are any positive weights (normalised here, as Megatron).
  // Without: `weights` must be integral sample counts (exhaustive blend).
  BlendedDataset(std::vector<std::shared_ptr<const GPTDataset>> datasets, std::vector<double> weights,
                 std::optional<int64_t> size, const GPTDatasetConfig& config);

  int64_t size() const override { return static_cast<int64_t>(dataset_index_.size()); }
  int32_t sequence_length() const override { return datasets_.front()->sequence_length(); }
  void sample(int64_t index, std::span<int32_t> out) const override;
  const PyJson& unique_identifiers() const override { return unique_identifiers_; }
  const std::string& description() const override { return description_; }
  bool built_anew() const override { return built_anew_; }

  const std::string& description_hash() const { return description_hash_; }
  std::string index_digest() const override;
  const std::vector<std::shared_ptr<const GPTDataset>>& datasets() const { return datasets_; }
  const NpyArray& dataset_index() const { return dataset_index_; }
  const NpyArray& dataset_sample_index() const { return dataset_sample_index_; }
  Split split() const { return split_; }

 private:
  std::vector<NpyArray> build_arrays() const;
  std::vector<std::shared_ptr<const GPTDataset>> datasets_;
  std::vector<double> weights_;     // normalised (size given)
  std::vector<int64_t> counts_;     // exhaustive (size absent)
  std::optional<int64_t> size_;
  Split split_;
  PyJson unique_identifiers_;
  std::string description_, description_hash_;
  NpyArray dataset_index_, dataset_sample_index_;
  bool built_anew_ = false;
};

}  // namespace tessera::data
