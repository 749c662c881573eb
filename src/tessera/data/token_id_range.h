// Whether a dataset's token ids fit a model's vocabulary, checked before training starts: an
// id at or beyond the padded vocabulary would index past the embedding table (data tokenized
// with a larger vocabulary than the model's, e.g. GPT-2 data under a small NullTokenizer).
//
// Cost: the .idx dtype bounds the ids for free (uint16 holds 0..65535, as Megatron's
// preprocess_data.py writes for vocabularies under 65500), so when that range fits the padded
// vocabulary nothing is read. Otherwise every token of the .bin is read once, in parallel over
// its sequences (docs/data.md gives the measured speed). Reading only the tokens a run will
// consume would be cheaper for a short run, but a real run reads the whole dataset anyway, and
// an id out of range anywhere in it means the data and the model do not belong together.
#pragma once

#include <cstdint>
#include <optional>
#include <string>
#include <vector>

#include "tessera/data/dataset_config.h"
#include "tessera/data/indexed_dataset.h"
#include "tessera/data/tokenizer.h"

namespace tessera::data {

struct TokenIdRange {
  int64_t min_id = 0, max_id = 0;  // the ids found, or the dtype's whole range when not scanned
  bool scanned = false;
  uint64_t bytes_read = 0;
  double seconds = 0;
  std::optional<uint64_t> first_bad_sequence;  // the first sequence with an id outside the vocabulary
};

// The ids of `dataset` against [0, vocab_limit): the dtype's range when it fits, else a scan.
TokenIdRange token_id_range(const IndexedDataset& dataset, int64_t vocab_limit);

// The model's vocabulary in words, for messages: "1024 ids (NullTokenizer --vocab-size 1000:
// 1001 tokens, padded to 1024)".
std::string describe_vocabulary(const TokenizerOptions& tokenizer, int64_t vocab_size, int64_t padded_vocab_size);

// "" when every id of `dataset` is in [0, padded_vocab_size), else the problem: the dataset,
// its largest (or negative) id, where it first appears and the vocabulary.
std::string token_id_problem(const IndexedDataset& dataset, const TokenIdRange& range, int64_t padded_vocab_size,
                             const std::string& vocabulary);
inline constexpr const char* kTokenIdHint =
    "train with the tokenizer flags the data was preprocessed with (--tokenizer-type, --vocab-file/--merge-file "
    "or --vocab-size), or run `tessera preprocess` again with this model's tokenizer";

// Every .bin/.idx prefix that `config` reads (blend and per-split blends), each once.
std::vector<std::string> dataset_prefixes(const GPTDatasetConfig& config);

// For the trainer: every dataset of `config` (none for mock data) against the vocabulary;
// throws a runtime Error naming the first dataset whose ids do not fit. Returns the datasets'
// ranges, in dataset_prefixes order, for a log line.
std::vector<TokenIdRange> check_token_ids_fit(const GPTDatasetConfig& config, int64_t padded_vocab_size,
                                              const std::string& vocabulary);

}  // namespace tessera::data
