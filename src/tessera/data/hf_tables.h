// What HuggingFaceTokenizer reads from a tokenizer.json (and tokenizer_config.json), in the
// form the encoder uses. Internal to hf_tokenizer*.cpp.
#pragma once

#include <array>
#include <cstdint>
#include <memory>
#include <optional>
#include <string>
#include <string_view>
#include <unordered_map>
#include <vector>

#include "tessera/data/bpe_merge.h"
#include "tessera/data/hf_unicode.h"
#include "tessera/data/regex_splitter.h"

namespace tessera::data {

// An entry of tokenizer.json's "added_tokens": matched in the text before pre-tokenization.
struct HfAddedToken {
  std::string content;  // for a "normalized" token: its normalized content
  int32_t id = 0;
  bool lstrip = false, rstrip = false;  // the match swallows the whitespace before / after it
  bool normalized = false;              // matched in the normalized text, not the raw text
};

// One step of the pre-tokenizer chain, applied to every piece of the previous step.
struct HfPretokenStep {
  enum Kind : uint8_t { SplitIsolated, SplitRemoved, PrefixSpace } kind;
  std::shared_ptr<const RegexPattern> pattern;  // Split steps
};

// Added tokens to find in a text, leftmost-longest, indexed by their first byte.
struct AddedTokenSet {
  std::vector<HfAddedToken> tokens;
  std::array<std::vector<uint32_t>, 256> by_first_byte;  // indices into tokens, longest first
  bool empty() const { return tokens.empty(); }
  void index();
};

// A string-keyed map that looks up by string_view without building a std::string.
struct StringHash {
  using is_transparent = void;
  size_t operator()(std::string_view s) const { return hash_bytes(s.data(), s.size()); }
};
using TokenIdMap = std::unordered_map<std::string, int32_t, StringHash, std::equal_to<>>;

struct HfTables {
  // The BPE model, with symbols numbered by vocab id.
  TokenIdMap id_of_bytes;              // a vocab token's raw bytes -> id (for ignore_merges)
  std::array<int32_t, 256> byte_id{};  // the token of each single byte
  MergeTable merges;
  bool ignore_merges = false;          // a pre-token that is itself a vocab token is not merged

  std::vector<UnicodeNormalization> normalizers;  // applied in order
  std::vector<HfPretokenStep> pretokenizer;
  AddedTokenSet raw_added, normalized_added;

  std::vector<int32_t> prefix_ids, suffix_ids;  // the post-processor's template around the text

  // Decoding, by id: a token's bytes (added tokens: their content).
  std::vector<std::string> bytes_of_id;
  std::vector<uint8_t> has_id;

  int64_t vocab_size = 0;  // len(tokenizer): distinct tokens of the model and the added tokens
  int32_t max_id = 0;
  int32_t eos = 0;
  std::optional<int32_t> bos, pad;
};

// Reads DIR/tokenizer.json (+ tokenizer_config.json, special_tokens_map.json).
std::shared_ptr<const HfTables> load_hf_tables(const std::string& dir);

}  // namespace tessera::data
