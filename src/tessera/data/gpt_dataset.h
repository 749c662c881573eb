// Megatron's GPTDataset (megatron/core/datasets/gpt_dataset.py and helpers.cpp at
// core_r0.10.0): the same document, sample and shuffle indices, hence the same samples in the
// same order, for the same files and flags.
//
// For one dataset prefix and one split (sequences [begin, end) of the prefix):
//   tokens per epoch  tpe = sum of the split's sequence lengths
//   epochs            smallest E with E * tpe >= num_samples * seq_length + 1 (E = 1 when
//                     num_samples is unset); a separate final epoch when E > 1 and the final
//                     epoch supplies fewer than int(0.80 * samples per epoch) samples
//   document_index    int32; [begin, end) repeated E times, shuffled with a fresh
//                     numpy RandomState(seed) (the first E-1 epochs and the last shuffled apart
//                     when separate)
//   sample_index      helpers.cpp build_sample_idx: (T + 1) x 2 rows of (position in
//                     document_index, token offset), T = (E * tpe - 1) // seq_length; int32
//                     unless max(len(document_index), longest sequence of the prefix) > 2^31-1
//   shuffle_index     uint32 (int64 from 2^32 - 2 samples) arange(T) shuffled by the same RNG
//                     after the document index; with a separate final epoch [0, sans) and
//                     [sans, T) are shuffled apart
//   sample(i)         seq_length + 1 tokens starting at sample_index[shuffle_index[i]]:
//                     consecutive samples overlap by one token.
// The arrays are cached as Megatron caches them (gpt_dataset_cache.h).
//
// Masks (make_ltor_sample): --reset-position-ids, --eod-mask-loss and --reset-attention-mask
// as Megatron's _get_ltor_masks_and_position_ids. The model supports only the plain causal
// mask: with --reset-attention-mask the function returns the start of each attention block
// (segment_starts) so that the trainer can support it or reject the flag; it does not build an
// S x S mask.
#pragma once

#include <cstdint>
#include <memory>
#include <optional>
#include <span>
#include <string>
#include <vector>

#include "tessera/core/mt19937.h"
#include "tessera/data/dataset_config.h"
#include "tessera/data/npy.h"

namespace tessera::data {

class IndexedDataset;

// ---- low-level datasets -------------------------------------------------------------------

// A list of token sequences (Megatron's LowLevelDataset).
class LowLevelDataset {
 public:
  virtual ~LowLevelDataset() = default;
  virtual uint64_t sequence_count() const = 0;
  virtual int32_t sequence_length(uint64_t i) const = 0;
  // Tokens [offset, offset + count) of sequence i, widened to int32, written to out.
  virtual void read_tokens(uint64_t i, uint64_t offset, uint64_t count, int32_t* out) const = 0;
  // The .bin/.idx prefix, or none for mock data.
  virtual std::optional<std::string> path_prefix() const = 0;
};

// An IndexedDataset (.bin/.idx, mapped read-only); tokens are read zero-copy from the map.
class IndexedLowLevelDataset final : public LowLevelDataset {
 public:
  explicit IndexedLowLevelDataset(const std::string& prefix);
  explicit IndexedLowLevelDataset(std::shared_ptr<const IndexedDataset> dataset);
  uint64_t sequence_count() const override;
  int32_t sequence_length(uint64_t i) const override;
  void read_tokens(uint64_t i, uint64_t offset, uint64_t count, int32_t* out) const override;
  std::optional<std::string> path_prefix() const override;
  const IndexedDataset& dataset() const { return *dataset_; }

 private:
  std::shared_ptr<const IndexedDataset> dataset_;
};

// ---- what the trainer reads ----------------------------------------------------------------

// A top-level dataset: sample i is sequence_length() + 1 token ids (Megatron's `text`; the
// inputs are the first S, the labels the last S). pad_id (-1) appears only in a kept partial
// last validation sample. sample() is const and safe to call from several threads.
class SampleDataset {
 public:
  virtual ~SampleDataset() = default;
  virtual int64_t size() const = 0;  // len(dataset)
  virtual int32_t sequence_length() const = 0;
  virtual void sample(int64_t index, std::span<int32_t> out) const = 0;
  // Megatron's unique_identifiers (the hashed description) and its text.
  virtual const PyJson& unique_identifiers() const = 0;
  virtual const std::string& description() const = 0;
  // Whether this process built (rather than loaded) any of its index arrays.
  virtual bool built_anew() const = 0;
  // SHA-256 (hex) over the index arrays that decide which tokens sample i holds, so that
  // processes (nodes with their own caches) can check they read the same samples.
  virtual std::string index_digest() const = 0;
};

// ---- index construction (pure functions, gpt_dataset.py's _build_document_sample_shuffle_indices)

struct EpochPlan {
  int64_t tokens_per_epoch = 0;
  int32_t num_epochs = 1;
  bool separate_final_epoch = false;
  int64_t num_samples_sans_final_epoch = 0;  // meaningful when separate_final_epoch
  int64_t total_samples = 0;                 // rows of sample_index - 1
};
// `drop_last_partial`: false only for a validation split with
// drop_last_partial_validation_sequence off (T is then the float32 ceiling).
EpochPlan plan_epochs(int64_t tokens_per_epoch, std::optional<int64_t> num_samples, int32_t seq_length,
                      bool drop_last_partial = true);

// _build_document_index for the contiguous sequence range [begin, end).
std::vector<int32_t> build_document_index(int64_t begin, int64_t end, int32_t num_epochs, Mt19937RandomState& rng,
                                          bool separate_final_epoch);
// helpers.build_sample_idx. `lengths[k]` is the length of sequence `lengths_base + k`;
// `max_sequence_length` is the longest sequence of the whole low-level dataset (it picks the
// dtype). Returns a (T + 1, 2) array, int32 or int64.
NpyArray build_sample_index(std::span<const int32_t> lengths, int64_t lengths_base,
                            std::span<const int32_t> document_index, int32_t seq_length, int32_t num_epochs,
                            int64_t tokens_per_epoch, bool drop_last_partial, int64_t max_sequence_length);
// _build_shuffle_index(num_samples, total_size, rng).
NpyArray build_shuffle_index(int64_t num_samples, int64_t total_size, Mt19937RandomState& rng);

// ---- GPTDataset ------------------------------------------------------------------------------

class GPTDataset final : public SampleDataset {
 public:
  // Builds (or loads from the cache) the indices for sequences [begin, end) of `low_level`.
  // `dataset_path` is the prefix exactly as given (hashed); `class_name` is "GPTDataset" or
  // "MockGPTDataset". Errors (empty split, unwritable cache, ...) are tessera::Errors.
  GPTDataset(std::shared_ptr<const LowLevelDataset> low_level, std::optional<std::string> dataset_path, int64_t begin,
             int64_t end, std::optional<int64_t> num_samples, Split split, const GPTDatasetConfig& config,
             std::string class_name = "GPTDataset");

  int64_t size() const override { return static_cast<int64_t>(sample_index_.shape()[0]) - 1; }
  int32_t sequence_length() const override { return seq_length_; }
  void sample(int64_t index, std::span<int32_t> out) const override;
  const PyJson& unique_identifiers() const override { return unique_identifiers_; }
  const std::string& description() const override { return description_; }
  bool built_anew() const override { return built_anew_; }

  const std::string& description_hash() const { return description_hash_; }
  std::string index_digest() const override;
  Split split() const { return split_; }
  std::optional<int64_t> num_samples() const { return num_samples_; }
  const EpochPlan& plan() const { return plan_; }
  const NpyArray& document_index() const { return document_index_; }
  const NpyArray& sample_index() const { return sample_index_; }
  const NpyArray& shuffle_index() const { return shuffle_index_; }
  // The cache folder in use, or "" when nothing is cached.
  const std::string& cache_dir() const { return cache_dir_; }
  // The sequence ids sample `index` draws from (Megatron's document_ids).
  std::vector<int64_t> sample_sequences(int64_t index) const;

 private:
  std::vector<NpyArray> build_arrays() const;
  std::string check_arrays(const std::vector<NpyArray>& arrays) const;

  std::shared_ptr<const LowLevelDataset> low_level_;
  int64_t begin_, end_;
  std::optional<int64_t> num_samples_;
  Split split_;
  int32_t seq_length_;
  uint32_t seed_;
  int64_t pad_id_;
  bool drop_last_partial_ = true;
  EpochPlan plan_;
  int64_t max_sequence_length_ = 0;
  PyJson unique_identifiers_;
  std::string description_, description_hash_, cache_dir_;
  NpyArray document_index_, sample_index_, shuffle_index_;
  bool built_anew_ = false;
};

// ---- masks and position ids (gpt_dataset.py's _get_ltor_masks_and_position_ids) ------------

struct LtorOptions {
  int64_t eod_id = 0;
  int64_t pad_id = -1;
  bool reset_position_ids = false;
  bool reset_attention_mask = false;
  bool eod_mask_loss = false;
};
inline LtorOptions ltor_options(const GPTDatasetConfig& c) {
  return {c.eod_id, c.pad_id, c.reset_position_ids, c.reset_attention_mask, c.eod_mask_loss};
}

// One sample as the model consumes it (Megatron's batch dict without the S x S mask).
struct LtorSample {
  std::vector<int32_t> tokens;        // text[:-1], pad ids replaced by 0
  std::vector<int32_t> labels;        // text[1:], pad ids replaced by 0
  std::vector<float> loss_mask;       // 1, or 0 at an EOD input (--eod-mask-loss) or pad label
  std::vector<int64_t> position_ids;  // 0..S-1, restarting after each EOD (--reset-position-ids)
  // --reset-attention-mask: the first position of each block of the block-diagonal causal
  // mask (always starts with 0; a new block after every EOD input that is not last). Empty
  // when the flag is off, meaning the plain causal mask.
  std::vector<int32_t> segment_starts;
};
// Pure: computes everything from `text` (S + 1 ids) as _get_ltor_masks_and_position_ids does
// on tokens = text[:-1], then Megatron's pad handling.
void make_ltor_sample(std::span<const int32_t> text, const LtorOptions& options, LtorSample& out);

}  // namespace tessera::data
