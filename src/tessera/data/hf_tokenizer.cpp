#include "tessera/data/hf_tokenizer.h"

#include <algorithm>

#include "tessera/core/error.h"
#include "tessera/data/hf_tables.h"
#include "tessera/data/utf8.h"

namespace tessera::data {

// One clone's working state: the regex match data and the pre-token cache.
class HfEncoder {
 public:
  explicit HfEncoder(const HfTables& t) : t_(t), cache_(t.byte_id) {
    for (const HfPretokenStep& step : t.pretokenizer)
      matchers_.push_back(step.pattern ? std::make_unique<RegexMatcher>(*step.pattern) : nullptr);
  }

  void encode(std::string_view text, std::vector<int32_t>& out) {
    out.insert(out.end(), t_.prefix_ids.begin(), t_.prefix_ids.end());
    split_added(text, t_.raw_added, out, [&](std::string_view piece) { encode_unmatched(piece, out); });
    out.insert(out.end(), t_.suffix_ids.begin(), t_.suffix_ids.end());
  }

 private:
  // tokenizers' AddedVocabulary::find_matches: added tokens leftmost-longest, each match
  // widened over the whitespace before it (lstrip) or after it (rstrip); the text between
  // matches goes to on_text.
  template <class OnText>
  void split_added(std::string_view text, const AddedTokenSet& set, std::vector<int32_t>& out, OnText&& on_text) {
    if (set.empty()) {
      if (!text.empty()) on_text(text);
      return;
    }
    size_t start_offset = 0;
    for (size_t i = 0; i < text.size();) {
      const HfAddedToken* hit = nullptr;
      for (uint32_t k : set.by_first_byte[static_cast<unsigned char>(text[i])])
        if (text.substr(i).starts_with(set.tokens[k].content)) {
          hit = &set.tokens[k];
          break;
        }
      if (!hit) {
        ++i;
        continue;
      }
      size_t start = i, stop = i + hit->content.size();
      if (hit->lstrip) start = std::max(start_offset, after_last_non_space(text, start));
      if (hit->rstrip) stop = skip_spaces(text, stop);
      if (start_offset < start) on_text(text.substr(start_offset, start - start_offset));
      out.push_back(hit->id);
      start_offset = stop;
      i += hit->content.size();  // the search goes on after the token itself, as aho-corasick's does
    }
    if (start_offset < text.size()) on_text(text.substr(start_offset));
  }

  static size_t after_last_non_space(std::string_view text, size_t end) {
    const auto* p = reinterpret_cast<const unsigned char*>(text.data());
    while (end > 0) {
      size_t b = end - 1;
      while (b > 0 && (p[b] & 0xC0) == 0x80) --b;
      size_t len;
      if (!is_white_space(utf8::decode_valid(p + b, len))) return end;
      end = b;
    }
    return 0;
  }

  static size_t skip_spaces(std::string_view text, size_t from) {
    const auto* p = reinterpret_cast<const unsigned char*>(text.data());
    size_t len;
    while (from < text.size() && is_white_space(utf8::decode_valid(p + from, len))) from += len;
    return from;
  }

  // Text between raw added tokens: normalized, then split by the normalized added tokens.
  void encode_unmatched(std::string_view piece, std::vector<int32_t>& out) {
    if (t_.normalizers.empty()) {
      split_added(piece, t_.normalized_added, out, [&](std::string_view p) { pretokenize(0, p, out); });
      return;
    }
    const std::string normalized = normalize(t_.normalizers, piece);
    split_added(normalized, t_.normalized_added, out, [&](std::string_view p) { pretokenize(0, p, out); });
  }

  // Applies pre-tokenizer step `step` and the ones after it to `piece`.
  void pretokenize(size_t step, std::string_view piece, std::vector<int32_t>& out) {
    if (step == t_.pretokenizer.size()) {
      encode_pretoken(piece, out);
      return;
    }
    const HfPretokenStep& s = t_.pretokenizer[step];
    if (s.kind == HfPretokenStep::PrefixSpace) {
      if (piece.starts_with(' ')) return pretokenize(step + 1, piece, out);
      std::string prefixed(1, ' ');
      prefixed += piece;
      return pretokenize(step + 1, prefixed, out);
    }
    size_t from = 0, begin = 0, end = 0;
    while (matchers_[step]->find(piece, from, begin, end)) {
      if (begin > from) pretokenize(step + 1, piece.substr(from, begin - from), out);
      if (s.kind == HfPretokenStep::SplitIsolated) pretokenize(step + 1, piece.substr(begin, end - begin), out);
      from = end;
    }
    if (from < piece.size()) pretokenize(step + 1, piece.substr(from), out);
  }

  // The BPE model on one pre-token's bytes (ByteLevel's alphabet is implicit: symbols are the
  // vocab ids of single bytes).
  void encode_pretoken(std::string_view piece, std::vector<int32_t>& out) {
    cache_.append_ids(piece, out, [this](std::string_view bytes, std::vector<int32_t>& word) {
      auto whole = t_.ignore_merges ? t_.id_of_bytes.find(bytes) : t_.id_of_bytes.end();
      if (whole != t_.id_of_bytes.end()) {
        word.push_back(whole->second);
        return;
      }
      for (unsigned char b : bytes) word.push_back(t_.byte_id[b]);
      bpe_merge(t_.merges, word);
    });
  }

  const HfTables& t_;
  std::vector<std::unique_ptr<RegexMatcher>> matchers_;  // by pre-tokenizer step; null for PrefixSpace
  PretokenCache cache_;
};

HuggingFaceTokenizer::HuggingFaceTokenizer(const std::string& dir)
    : tables_(load_hf_tables(dir)), encoder_(std::make_unique<HfEncoder>(*tables_)) {}

HuggingFaceTokenizer::HuggingFaceTokenizer(const HuggingFaceTokenizer& other)
    : tables_(other.tables_), encoder_(std::make_unique<HfEncoder>(*tables_)) {}

HuggingFaceTokenizer::~HuggingFaceTokenizer() = default;

int64_t HuggingFaceTokenizer::vocab_size() const { return tables_->vocab_size; }
int32_t HuggingFaceTokenizer::eod() const { return tables_->eos; }
int32_t HuggingFaceTokenizer::pad() const { return tables_->pad.value_or(-1); }
std::optional<int32_t> HuggingFaceTokenizer::bos() const { return tables_->bos; }
int32_t HuggingFaceTokenizer::max_token_id() const { return tables_->max_id; }

void HuggingFaceTokenizer::encode(std::string_view text, std::vector<int32_t>& out) {
  if (size_t bad = utf8::find_invalid(text); bad != utf8::npos)
    throw runtime_error("invalid UTF-8 at byte " + std::to_string(bad) + " of the text");
  encoder_->encode(text, out);
}

std::string HuggingFaceTokenizer::decode(std::span<const int32_t> ids) const {
  std::string bytes;
  for (int32_t id : ids) {
    if (id < 0 || id > tables_->max_id || !tables_->has_id[id])
      throw runtime_error("cannot decode token id " + std::to_string(id) + ": not in the vocabulary");
    bytes += tables_->bytes_of_id[id];
  }
  return utf8::decode_with_replacement(bytes);
}

std::unique_ptr<Tokenizer> HuggingFaceTokenizer::clone() const {
  return std::make_unique<HuggingFaceTokenizer>(*this);
}

}  // namespace tessera::data
