// Megatron's --tokenizer-type HuggingFaceTokenizer (megatron/training/tokenizer/tokenizer.py
// _HuggingFaceTokenizer) for byte-level BPE tokenizers: `--tokenizer-model DIR` holds the
// `tokenizer.json` of the `tokenizers` library (Llama-3, Qwen2, GPT-4-style and GPT-2-style
// files) and the `tokenizer_config.json` / `special_tokens_map.json` that transformers'
// AutoTokenizer reads for the special tokens.
//
// Megatron tokenizes with `tokenizer(text).input_ids`, so this is the `tokenizers` library's
// encode with add_special_tokens: added tokens are split out of the raw text first (those
// marked "normalized" out of the normalized text), the rest is normalized, pre-tokenized by
// the Split regexes and ByteLevel, merged by the BPE model, and the post-processor's template
// (e.g. Llama-3's <|begin_of_text|>) is put around the result. EOD is the eos_token's id,
// vocab_size is len(tokenizer) (model vocabulary and added tokens), as in Megatron.
//
// Anything else a tokenizer.json may hold (another model type, a Metaspace pre-tokenizer,
// BPE dropout, ...) is a tessera::Error naming the component's type and its JSON path.
#pragma once

#include <memory>
#include <optional>
#include <string>

#include "tessera/data/tokenizer.h"

namespace tessera::data {

struct HfTables;
class HfEncoder;

class HuggingFaceTokenizer final : public Tokenizer {
 public:
  // Reads DIR/tokenizer.json and, when present, DIR/tokenizer_config.json and
  // DIR/special_tokens_map.json. Errors name the file and the JSON path.
  explicit HuggingFaceTokenizer(const std::string& dir);
  HuggingFaceTokenizer(const HuggingFaceTokenizer& other);  // shares the tables, own scratch state
  ~HuggingFaceTokenizer() override;

  std::string_view type() const override { return "HuggingFaceTokenizer"; }
  int64_t vocab_size() const override;
  int32_t eod() const override;
  // The pad_token's id (Qwen2's default: <|endoftext|>, its EOD too), else -1.
  int32_t pad() const override;
  std::optional<int32_t> bos() const override;
  // The largest token id (ids need not be dense: vocab_size may be smaller).
  int32_t max_token_id() const;
  void encode(std::string_view text, std::vector<int32_t>& out) override;
  using Tokenizer::encode;
  // The tokens' bytes (added tokens as their text), decoded with errors='replace'.
  std::string decode(std::span<const int32_t> ids) const override;
  std::unique_ptr<Tokenizer> clone() const override;

 private:
  std::shared_ptr<const HfTables> tables_;
  std::unique_ptr<HfEncoder> encoder_;
};

}  // namespace tessera::data
