#include "tessera/data/sentencepiece_tokenizer.h"

#include <sentencepiece_processor.h>
#include <sys/stat.h>

#include "tessera/core/error.h"
#include "tessera/data/utf8.h"

namespace tessera::data {
namespace {

std::shared_ptr<const sentencepiece::SentencePieceProcessor> load_model(const std::string& path, const char* type) {
  const std::string what = std::string("--tokenizer-model ") + path;
  const std::string hint = std::string(type) + " takes a SentencePiece model file (e.g. Llama-2's tokenizer.model)";
  struct stat st {};
  if (path.empty()) throw usage_error(std::string("--tokenizer-type ") + type + " needs --tokenizer-model", hint);
  if (stat(path.c_str(), &st) != 0) throw runtime_error(what + ": no such file", hint);
  if (!S_ISREG(st.st_mode)) throw runtime_error(what + ": not a regular file", hint);
  auto sp = std::make_shared<sentencepiece::SentencePieceProcessor>();
  const auto status = sp->Load(path);
  if (!status.ok())
    throw runtime_error(what + ": not a SentencePiece model (" + status.ToString() + ")", hint);
  return sp;
}

}  // namespace

SentencePieceTokenizer::SentencePieceTokenizer(const std::string& model_file, Flavor flavor)
    : SentencePieceTokenizer(load_model(model_file, flavor == Flavor::Llama2 ? "Llama2Tokenizer"
                                                                               : "GPTSentencePieceTokenizer"),
                             flavor, model_file) {
  const std::string where = "--tokenizer-model " + model_file_;
  if (sp_->eos_id() < 0)
    throw runtime_error(where + ": the model has no eos piece, whose id Megatron's " + std::string(type()) +
                            " uses as EOD",
                        "train the SentencePiece model with an eos piece (eos_id >= 0)");
  if (flavor_ == Flavor::Llama2 && sp_->bos_id() < 0)
    throw runtime_error(where + ": the model has no bos piece, which Llama2Tokenizer puts before every document",
                        "use GPTSentencePieceTokenizer (no bos), or a model with a bos piece");
}

SentencePieceTokenizer::SentencePieceTokenizer(std::shared_ptr<const sentencepiece::SentencePieceProcessor> sp,
                                               Flavor flavor, std::string model_file)
    : sp_(std::move(sp)), flavor_(flavor), model_file_(std::move(model_file)) {}

SentencePieceTokenizer::~SentencePieceTokenizer() = default;

std::string_view SentencePieceTokenizer::type() const {
  return flavor_ == Flavor::Llama2 ? "Llama2Tokenizer" : "GPTSentencePieceTokenizer";
}

int64_t SentencePieceTokenizer::vocab_size() const { return sp_->GetPieceSize(); }
int32_t SentencePieceTokenizer::eod() const { return sp_->eos_id(); }
std::optional<int32_t> SentencePieceTokenizer::bos() const {
  return sp_->bos_id() >= 0 ? std::optional<int32_t>(sp_->bos_id()) : std::nullopt;
}
int32_t SentencePieceTokenizer::pad() const { return flavor_ == Flavor::GPT ? sp_->pad_id() : -1; }

void SentencePieceTokenizer::encode(std::string_view text, std::vector<int32_t>& out) {
  if (size_t bad = utf8::find_invalid(text); bad != utf8::npos)
    throw runtime_error("invalid UTF-8 at byte " + std::to_string(bad) + " of the text");
  const auto status = sp_->Encode(text, &scratch_);
  if (!status.ok()) throw runtime_error("SentencePiece failed to encode the text: " + status.ToString());
  if (flavor_ == Flavor::Llama2) out.push_back(sp_->bos_id());
  out.insert(out.end(), scratch_.begin(), scratch_.end());
}

std::string SentencePieceTokenizer::decode(std::span<const int32_t> ids) const {
  std::vector<int> v(ids.begin(), ids.end());
  for (int id : v)
    if (id < 0 || id >= sp_->GetPieceSize())
      throw runtime_error("cannot decode token id " + std::to_string(id) + ": not in the vocabulary");
  std::string text;
  const auto status = sp_->Decode(v, &text);
  if (!status.ok()) throw runtime_error("SentencePiece failed to decode: " + status.ToString());
  return text;
}

std::unique_ptr<Tokenizer> SentencePieceTokenizer::clone() const {
  return std::unique_ptr<Tokenizer>(new SentencePieceTokenizer(sp_, flavor_, model_file_));
}

}  // namespace tessera::data
