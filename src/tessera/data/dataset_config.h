// The configuration of Megatron's GPT datasets (megatron/core/datasets/
// blended_megatron_dataset_config.py, gpt_dataset.py's GPTDatasetConfig), from
// Megatron's flags to one validated value:
//
//   --data-path / --data-args-path       -> blend (get_blend_from_list, megatron/core/datasets/utils.py)
//   --train/valid/test-data-path, --per-split-data-args-path -> blend_per_split
//   --split                              -> split vector -> split matrix (parse_and_normalize_split)
//   --mock-data (or no data flags)       -> mock, split "1,1,1" (MockGPTDataset)
//   --seed --seq-length --data-cache-path --reset-position-ids --reset-attention-mask
//   --eod-mask-loss --renormalize-blend-weights, and the tokenizer's identity (for the hash)
//
// and the requested sample counts (megatron/training/training.py). It also holds PyJson, the
// small JSON value whose dumps() reproduces Python's json.dumps(..., indent=4) byte for byte
// (floats in repr form, ASCII escapes), because Megatron's cache file names are the MD5 of
// that text.
//
// Typical use by the trainer:
//   DataArgs a;  a.data_path = {...};  a.split = "949,50,1";  a.seed = 1234;  a.seq_length = 1024;
//   GPTDatasetConfig cfg = make_gpt_dataset_config(a, gpt2_bpe_tokenizer_identity(vocab, merges), 50256);
//   SplitSizes sizes = requested_sample_counts(train_iters, train_samples, gbs, eval_interval, eval_iters);
//   auto datasets = build_gpt_datasets(cfg, sizes);     // gpt_dataset_builder.h
#pragma once

#include <array>
#include <cstdint>
#include <optional>
#include <string>
#include <utility>
#include <variant>
#include <vector>

#include "tessera/data/tokenizer.h"

namespace tessera::data {

enum class Split : int { Train = 0, Valid = 1, Test = 2 };
inline constexpr std::array<Split, 3> kAllSplits = {Split::Train, Split::Valid, Split::Test};
const char* split_name(Split split);  // "train", "valid", "test" (Megatron's Split.name)

// ---- Python-compatible JSON ---------------------------------------------------------------

// A JSON value as Python's json module sees it. Objects keep insertion order (OrderedDict).
class PyJson {
 public:
  struct Float {
    double value;
  };
  using Array = std::vector<PyJson>;
  using Object = std::vector<std::pair<std::string, PyJson>>;

  PyJson() : v_(std::monostate{}) {}  // null (None)
  PyJson(std::nullptr_t) : v_(std::monostate{}) {}
  PyJson(bool b) : v_(b) {}
  PyJson(int v) : v_(static_cast<int64_t>(v)) {}
  PyJson(int64_t v) : v_(v) {}
  PyJson(Float f) : v_(f) {}
  PyJson(double d) : v_(Float{d}) {}
  PyJson(const char* s) : v_(std::string(s)) {}
  PyJson(std::string s) : v_(std::move(s)) {}
  PyJson(Array a) : v_(std::move(a)) {}
  PyJson(Object o) : v_(std::move(o)) {}
  template <class T>
  PyJson(const std::optional<T>& o) : PyJson() {
    if (o) *this = PyJson(*o);
  }

  // json.dumps(value, indent=4): separators (",", ": "), ensure_ascii, floats as repr().
  std::string dumps(int indent = 4) const;

 private:
  void dump(std::string& out, int indent, int level) const;
  std::variant<std::monostate, bool, int64_t, Float, std::string, Array, Object> v_;
};

// A float as json.dumps writes it (Python's repr()): the shortest string that round-trips ("0.8", "1.0", "1e-05",
// "0.9000000000000001", "inf", "nan").
std::string json_float_repr(double value);
// Python's round() of a float to an int: round half to even.
int64_t python_round(double value);
// numpy.sum of a float64 array (pairwise summation, as numpy does it), then w / sum.
double numpy_sum(const std::vector<double>& values);
std::vector<double> normalize_weights(const std::vector<double>& weights);
// Lowercase hex MD5 of `text` (OpenSSL).
std::string md5_hex(const std::string& text);

// ---- blends and splits --------------------------------------------------------------------

// A list of dataset prefixes and, optionally, their weights (not yet normalised).
struct Blend {
  std::vector<std::string> prefixes;
  std::optional<std::vector<double>> weights;
};

// Megatron's get_blend_from_list: an odd count is prefixes only; an even count is
// weight/prefix pairs unless some weight does not parse as a float, then all are prefixes.
// Prefixes are stripped of whitespace. An empty list is a usage error.
Blend blend_from_list(const std::vector<std::string>& items, const std::string& flag = "--data-path");
// The same list read from a file (--data-args-path), split on whitespace.
Blend blend_from_file(const std::string& path);

// One split's bookends [lo, hi) as fractions; lo_is_int_zero marks Megatron's integer 0 start
// of the first bookend (it prints as "0", not "0.0", in the hashed description).
struct Bookend {
  double lo = 0.0, hi = 0.0;
  bool lo_is_int_zero = false;
};
using SplitMatrix = std::array<std::optional<Bookend>, 3>;

// parse_and_normalize_split: numbers matching [.0-9]+, padded with 0.0 to three, each >= 0,
// divided by their (numpy) sum. A malformed string is a usage error naming --split.
std::vector<double> parse_split_vector(const std::string& split);
// convert_split_vector_to_split_matrix (one vector): cumulative bookends; zero width -> none.
SplitMatrix split_matrix_from_vector(const std::vector<double>& vector);
SplitMatrix split_matrix_from_string(const std::string& split);
// The sequence index range [begin, end) of one bookend for a dataset of `num_elements`
// sequences: int(round(lo * N)), int(round(hi * N)) (as MegatronDataset's split ranges).
std::pair<int64_t, int64_t> split_range(const Bookend& bookend, int64_t num_elements);

// ---- requested sample counts (megatron/training/training.py) ------------------------------

using SplitSizes = std::array<std::optional<int64_t>, 3>;  // train, valid, test; nullopt = one epoch
// train = train_samples or train_iters * gbs; valid = (train_iters // eval_interval + 1) *
// eval_iters * gbs; test = eval_iters * gbs. With --train-samples pass the derived train_iters
// (train_samples // gbs without batch-size ramp-up), as Megatron does.
SplitSizes requested_sample_counts(int64_t train_iters, std::optional<int64_t> train_samples,
                                   int64_t global_batch_size, int64_t eval_interval, int64_t eval_iters);
// Megatron's " > datasets target sizes (minimum size):" block, one line per split.
std::string format_target_sizes(const SplitSizes& sizes);

// ---- tokenizer identity -------------------------------------------------------------------

// The tokenizer's unique_identifiers as Megatron hashes them: {"class": ..., "tokenizer_path":
// [...], <options as strings>...}.
struct TokenizerIdentity {
  std::string class_name;
  std::vector<std::optional<std::string>> paths;
  std::vector<std::pair<std::string, std::string>> options;
  PyJson to_json() const;
};
// --tokenizer-type GPT2BPETokenizer: {"class": "_GPT2BPETokenizer", "tokenizer_path": [vocab, merges]}.
TokenizerIdentity gpt2_bpe_tokenizer_identity(const std::string& vocab_file, const std::string& merge_file);
// --tokenizer-type NullTokenizer: {"class": "_NullTokenizer", "tokenizer_path": [null], "vocab_size": "N"}.
TokenizerIdentity null_tokenizer_identity(int64_t vocab_size);
// Any --tokenizer-type tessera builds. HuggingFaceTokenizer: {"class": "_HuggingFaceTokenizer",
// "tokenizer_path": [dir]}; Llama2Tokenizer / GPTSentencePieceTokenizer: {"class":
// "_Llama2Tokenizer" / "_GPTSentencePieceTokenizer", "tokenizer_path": [model], "vocab_extra_ids": "0"}.
TokenizerIdentity tokenizer_identity(const TokenizerOptions& tokenizer);

// ---- the configuration ---------------------------------------------------------------------

struct GPTDatasetConfig {
  uint32_t random_seed = 1234;  // --seed
  int32_t sequence_length = 0;  // --seq-length

  // Exactly one of: blend (same distribution, split by `split`), blend_per_split, or mock.
  std::optional<Blend> blend;
  std::optional<std::array<std::optional<Blend>, 3>> blend_per_split;
  bool mock = false;
  std::optional<std::string> split;         // the raw --split string (hashed as given)
  std::optional<SplitMatrix> split_matrix;  // derived from `split`; absent with blend_per_split

  std::optional<std::string> path_to_cache;  // --data-cache-path
  TokenizerIdentity tokenizer;
  int64_t eod_id = 0;   // the tokenizer's EOD (GPT-2: 50256; Null: vocab_size)
  int64_t pad_id = -1;  // Megatron's _PAD_TOKEN_ID when the tokenizer has no pad

  bool reset_position_ids = false;
  bool reset_attention_mask = false;
  bool eod_mask_loss = false;
  bool drop_last_partial_validation_sequence = true;
  bool renormalize_blend_weights = false;  // --renormalize-blend-weights

  // Cache checks beyond Megatron's (see gpt_dataset_cache.h): re-hash the .npy contents on
  // every load (SHA-256). Sizes and headers are always checked.
  bool verify_cache_contents = true;
  bool verbose = true;  // Megatron's "Build/Load the GPTDataset train indices" lines (rank 0)

  // Checks the combination (a usage error naming the flag) and derives split_matrix; with
  // neither blend nor blend_per_split it sets mock and split "1,1,1" (Megatron's config does).
  void finalize();
};

// Megatron's data flags as given on the command line (the trainer fills this from its table).
struct DataArgs {
  std::optional<std::vector<std::string>> data_path;
  std::optional<std::string> data_args_path;
  std::optional<std::vector<std::string>> train_data_path, valid_data_path, test_data_path;
  std::optional<std::string> per_split_data_args_path;
  std::optional<std::string> split;
  std::optional<std::string> data_cache_path;
  bool mock_data = false;
  bool renormalize_blend_weights = false;
  uint32_t seed = 1234;
  int32_t seq_length = 0;
  bool reset_position_ids = false, reset_attention_mask = false, eod_mask_loss = false;
};

// get_blend_and_blend_per_split + core_gpt_dataset_config_from_args: exactly one data source
// (--mock-data, --data-path/--data-args-path, or the per-split paths; none is a usage error);
// --split defaults to "969, 30, 1" (with a warning on stderr, as Megatron) when --data-path
// is given without it; --mock-data forces split "1,1,1". eod_id is the tokenizer's EOD.
GPTDatasetConfig make_gpt_dataset_config(const DataArgs& args, TokenizerIdentity tokenizer, int64_t eod_id);

}  // namespace tessera::data
