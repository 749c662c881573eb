// build_tokenizer: Megatron's --tokenizer-type names to tessera's tokenizers
// (megatron/training/tokenizer/tokenizer.py build_tokenizer).
#include "tessera/core/error.h"
#include "tessera/data/gpt2_bpe_tokenizer.h"
#include "tessera/data/hf_tokenizer.h"
#include "tessera/data/sentencepiece_tokenizer.h"
#include "tessera/data/tokenizer.h"

namespace tessera::data {
namespace {

constexpr const char* kImplemented =
    "tessera implements GPT2BPETokenizer, HuggingFaceTokenizer (byte-level BPE), Llama2Tokenizer, "
    "GPTSentencePieceTokenizer and NullTokenizer";

std::unique_ptr<Tokenizer> build_model_file_tokenizer(const TokenizerOptions& o) {
  if (o.tokenizer_model.empty())
    throw usage_error("--tokenizer-type " + o.type + " needs --tokenizer-model",
                      o.type == "HuggingFaceTokenizer"
                          ? "pass the folder holding tokenizer.json and tokenizer_config.json"
                          : "pass the SentencePiece model file (e.g. tokenizer.model)");
  std::unique_ptr<Tokenizer> t;
  if (o.type == "HuggingFaceTokenizer") t = std::make_unique<HuggingFaceTokenizer>(o.tokenizer_model);
  else if (o.type == "Llama2Tokenizer")
    t = std::make_unique<SentencePieceTokenizer>(o.tokenizer_model, SentencePieceTokenizer::Flavor::Llama2);
  else t = std::make_unique<SentencePieceTokenizer>(o.tokenizer_model, SentencePieceTokenizer::Flavor::GPT);
  // Megatron sizes these vocabularies from the model file and never reads --vocab-size; one
  // that cannot hold the model's tokens means the flags and the model disagree.
  if (o.vocab_size && *o.vocab_size < t->vocab_size())
    throw usage_error("--vocab-size " + std::to_string(*o.vocab_size) + " is smaller than the vocabulary of " +
                          "--tokenizer-model " + o.tokenizer_model + " (" + std::to_string(t->vocab_size()) +
                          " tokens)",
                      "drop --vocab-size: " + o.type + " takes its vocabulary from the model file");
  return t;
}

}  // namespace

std::unique_ptr<Tokenizer> build_tokenizer(const TokenizerOptions& o) {
  const std::string& type = o.type;
  if (type.empty())
    throw usage_error("--tokenizer-type is required",
                      "use --tokenizer-type GPT2BPETokenizer --vocab-file vocab.json --merge-file merges.txt");
  if (type == "GPT2BPETokenizer") {
    if (o.vocab_file.empty() || o.merge_file.empty())
      throw usage_error("GPT2BPETokenizer needs --vocab-file and --merge-file",
                        "pass GPT-2's vocab.json and merges.txt");
    return std::make_unique<GPT2BPETokenizer>(o.vocab_file, o.merge_file);
  }
  if (type == "NullTokenizer") {
    if (!o.vocab_size) throw usage_error("NullTokenizer needs --vocab-size", "e.g. --vocab-size 50257");
    return std::make_unique<NullTokenizer>(*o.vocab_size);
  }
  if (type == "HuggingFaceTokenizer" || type == "Llama2Tokenizer" || type == "GPTSentencePieceTokenizer")
    return build_model_file_tokenizer(o);
  for (const char* t : {"BertWordPieceLowerCase", "BertWordPieceCase", "SentencePieceTokenizer", "TikTokenizer",
                        "MultimodalTokenizer"})
    if (type == t) throw usage_error("--tokenizer-type " + type + " is not supported yet", kImplemented);
  throw usage_error("unknown --tokenizer-type " + type, std::string(kImplemented) + " (Megatron's names)");
}

}  // namespace tessera::data
