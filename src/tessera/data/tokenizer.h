// Tokenizers behind one interface, as Megatron's `build_tokenizer` offers them to
// tools/preprocess_data.py and pretrain_gpt.py (megatron/training/tokenizer/tokenizer.py,
// gpt2_tokenization.py).
//
// A Tokenizer object is not thread-safe for encode() (it owns a cache); give each thread its
// own with clone(), which shares the read-only vocabulary tables.
#pragma once

#include <cstdint>
#include <memory>
#include <optional>
#include <span>
#include <string>
#include <string_view>
#include <vector>

namespace tessera::data {

class Tokenizer {
 public:
  virtual ~Tokenizer() = default;
  // Megatron's --tokenizer-type spelling, e.g. "GPT2BPETokenizer".
  virtual std::string_view type() const = 0;
  // Megatron's tokenizer.vocab_size: unpadded (GPT-2: 50257; Null: --vocab-size + 1).
  virtual int64_t vocab_size() const = 0;
  virtual int32_t eod() const = 0;
  // Megatron's tokenizer.pad as its GPTDataset reads it: labels equal to it get no loss and
  // inputs equal to it become 0. -1 (Megatron's _PAD_TOKEN_ID) when the tokenizer has none.
  virtual int32_t pad() const { return -1; }
  // The tokenizer's beginning-of-text id (a Hugging Face export's bos_token_id); nullopt
  // without one.
  virtual std::optional<int32_t> bos() const { return std::nullopt; }
  // Appends the ids of `text` to `out`. Throws tessera::Error for text it cannot encode
  // (invalid UTF-8; for NullTokenizer, a piece that is not an id).
  virtual void encode(std::string_view text, std::vector<int32_t>& out) = 0;
  virtual std::string decode(std::span<const int32_t> ids) const = 0;
  virtual std::unique_ptr<Tokenizer> clone() const = 0;

  std::vector<int32_t> encode(std::string_view text) {
    std::vector<int32_t> ids;
    encode(text, ids);
    return ids;
  }
};

struct TokenizerOptions {
  std::string type;        // --tokenizer-type
  std::string vocab_file;  // --vocab-file
  std::string merge_file;  // --merge-file
  std::optional<int64_t> vocab_size;  // --vocab-size (NullTokenizer)
  std::string tokenizer_model;  // --tokenizer-model: HuggingFaceTokenizer's folder, a SentencePiece .model
};

// Builds the tokenizer named by options.type (GPT2BPETokenizer, HuggingFaceTokenizer,
// Llama2Tokenizer, GPTSentencePieceTokenizer, NullTokenizer); a usage error names what is
// missing or unsupported.
std::unique_ptr<Tokenizer> build_tokenizer(const TokenizerOptions& options);

// Megatron's _NullTokenizer: text is space-separated integer ids; vocab_size is
// --vocab-size + 1 and EOD is --vocab-size. Unlike Megatron, empty text is an empty document
// (Megatron fails on int('')) and ids outside [0, vocab_size) are rejected.
class NullTokenizer final : public Tokenizer {
 public:
  explicit NullTokenizer(int64_t vocab_size_without_eod);
  std::string_view type() const override { return "NullTokenizer"; }
  int64_t vocab_size() const override { return vocab_size_without_eod_ + 1; }
  int32_t eod() const override { return static_cast<int32_t>(vocab_size_without_eod_); }
  void encode(std::string_view text, std::vector<int32_t>& out) override;
  using Tokenizer::encode;
  std::string decode(std::span<const int32_t> ids) const override;
  std::unique_ptr<Tokenizer> clone() const override { return std::make_unique<NullTokenizer>(*this); }

 private:
  int64_t vocab_size_without_eod_;
};

}  // namespace tessera::data
