// GPT-2 byte-level BPE exactly as Megatron applies it (megatron/training/tokenizer/gpt2_tokenization.py):
// vocab.json + merges.txt, GPT-2 pre-tokenization, the byte-to-unicode map, merges applied by
// rank to every non-overlapping occurrence, unknown tokens as id 0, EOD = <|endoftext|>, and
// `<|endoftext|>` written in text is ordinary text.
//
// Speed: results are cached per pre-token (bounded; cleared when full), merge ranks live in
// an open-addressing table keyed by the pair of symbol ids.
#pragma once

#include <memory>
#include <string>
#include <vector>

#include "tessera/data/tokenizer.h"

namespace tessera::data {

struct Gpt2Tables;
class PretokenCache;

class GPT2BPETokenizer final : public Tokenizer {
 public:
  // Reads the files; a missing or malformed file is a tessera::Error naming the file, the
  // line and (for JSON) the column. Stricter than Megatron, which accepts any text as merges:
  // vocab ids must be 0..N-1 once each with a token for every byte; merges.txt must start
  // with its "#version" header, end with a newline and hold at least one merge, and every
  // merge's two pieces and their concatenation must be vocab tokens, and every vocab token
  // must be a byte, a special "<...>" token or made by some merge.
  GPT2BPETokenizer(const std::string& vocab_file, const std::string& merge_file);
  GPT2BPETokenizer(const GPT2BPETokenizer& other);  // shares the tables, fresh cache
  ~GPT2BPETokenizer() override;

  std::string_view type() const override { return "GPT2BPETokenizer"; }
  int64_t vocab_size() const override;
  int32_t eod() const override;
  // <|endoftext|> is GPT-2's bos token too (transformers' GPT2Tokenizer).
  std::optional<int32_t> bos() const override { return eod(); }
  void encode(std::string_view text, std::vector<int32_t>& out) override;
  using Tokenizer::encode;
  // Python's detokenize: bytes of the tokens, decoded with errors='replace'.
  std::string decode(std::span<const int32_t> ids) const override;
  std::unique_ptr<Tokenizer> clone() const override;

  // The vocab.json key of an id (the byte-level "piece"), empty if the id is unknown.
  std::string_view piece(int32_t id) const;
  // For tests: the BPE of one pre-token's bytes, by the round-based algorithm (heap=false) or
  // the heap-based one used for long pre-tokens (heap=true). Returns vocab ids.
  std::vector<int32_t> bpe_for_testing(std::string_view pretoken, bool heap) const;

 private:
  std::shared_ptr<const Gpt2Tables> tables_;
  std::unique_ptr<PretokenCache> cache_;
};

}  // namespace tessera::data
