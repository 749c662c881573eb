// Megatron's SentencePiece tokenizers for GPT training (megatron/training/tokenizer/tokenizer.py),
// through the SentencePiece library itself (Debian's libsentencepiece):
//   Llama2Tokenizer            (_Llama2Tokenizer):            [bos] + sp.encode(text)
//   GPTSentencePieceTokenizer  (_GPTSentencePieceTokenizer):  sp.encode_as_ids(text)
// Both: EOD = the model's eos id, vocab_size = its piece count, no special-token splitting
// (`</s>` written in the text is ordinary text).
#pragma once

#include <memory>
#include <string>

#include "tessera/data/tokenizer.h"

namespace sentencepiece {
class SentencePieceProcessor;
}

namespace tessera::data {

class SentencePieceTokenizer final : public Tokenizer {
 public:
  enum class Flavor { Llama2, GPT };
  // Loads `model_file` (--tokenizer-model); a missing or unreadable file, or a model without
  // the eos (and, for Llama2Tokenizer, bos) piece Megatron needs, is a tessera::Error.
  SentencePieceTokenizer(const std::string& model_file, Flavor flavor);
  ~SentencePieceTokenizer() override;

  std::string_view type() const override;
  int64_t vocab_size() const override;
  int32_t eod() const override;
  // GPTSentencePieceTokenizer: the model's pad id (-1 without one). Llama2Tokenizer: -1, as in
  // Megatron, whose _Llama2Tokenizer stores pad_id where its `pad` property does not look.
  int32_t pad() const override;
  // The model's bos piece (Llama2Tokenizer puts it before every document).
  std::optional<int32_t> bos() const override;
  void encode(std::string_view text, std::vector<int32_t>& out) override;
  using Tokenizer::encode;
  std::string decode(std::span<const int32_t> ids) const override;
  // The processor is read-only after loading and SentencePiece's Encode is const, so clones share it.
  std::unique_ptr<Tokenizer> clone() const override;

 private:
  SentencePieceTokenizer(std::shared_ptr<const sentencepiece::SentencePieceProcessor> sp, Flavor flavor,
                         std::string model_file);
  std::shared_ptr<const sentencepiece::SentencePieceProcessor> sp_;
  Flavor flavor_;
  std::string model_file_;
  std::vector<int> scratch_;
};

}  // namespace tessera::data
