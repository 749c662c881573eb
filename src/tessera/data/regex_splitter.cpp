#include "tessera/data/regex_splitter.h"

#define PCRE2_CODE_UNIT_WIDTH 8
#include <pcre2.h>

#include "tessera/core/error.h"

namespace tessera::data {

struct RegexPattern::Code {
  pcre2_code* re = nullptr;
  bool jit = false;
};

std::string onig_to_pcre2(std::string_view pattern) {
  std::string out;
  out.reserve(pattern.size() + 32);
  bool quoted = false;  // inside \Q...\E every character is literal
  for (size_t i = 0; i < pattern.size(); ++i) {
    const char c = pattern[i];
    if (c != '\\' || i + 1 == pattern.size()) {
      out += c;
      continue;
    }
    const char n = pattern[++i];
    if (quoted) {
      quoted = n != 'E';
      out += '\\';
      out += n;
    } else if (n == 's') {
      out += "\\p{White_Space}";
    } else if (n == 'S') {
      out += "\\P{White_Space}";
    } else {
      quoted = n == 'Q';
      out += '\\';
      out += n;
    }
  }
  return out;
}

RegexPattern::RegexPattern(std::string_view pattern, const std::string& where) : code_(std::make_unique<Code>()) {
  const std::string translated = onig_to_pcre2(pattern);
  int err = 0;
  PCRE2_SIZE offset = 0;
  code_->re = pcre2_compile(reinterpret_cast<PCRE2_SPTR>(translated.data()), translated.size(),
                            PCRE2_UTF | PCRE2_UCP | PCRE2_NO_UTF_CHECK, &err, &offset, nullptr);
  if (!code_->re) {
    PCRE2_UCHAR msg[256];
    pcre2_get_error_message(err, msg, sizeof msg);
    throw runtime_error(where + ": the regex \"" + std::string(pattern.substr(0, 200)) +
                            "\" does not compile: " + reinterpret_cast<const char*>(msg) + " (at offset " +
                            std::to_string(offset) + " of its PCRE2 form)",
                        "tessera runs tokenizer.json's split patterns with PCRE2; this construct is not supported");
  }
  code_->jit = pcre2_jit_compile(code_->re, PCRE2_JIT_COMPLETE) == 0;
}

RegexPattern::~RegexPattern() { pcre2_code_free(code_->re); }

struct RegexMatcher::State {
  const RegexPattern::Code* code;
  pcre2_match_data* md;
};

RegexMatcher::RegexMatcher(const RegexPattern& pattern) : state_(std::make_unique<State>()) {
  state_->code = &pattern.code();
  state_->md = pcre2_match_data_create_from_pattern(state_->code->re, nullptr);
  TESSERA_CHECK(state_->md != nullptr, "out of memory for PCRE2 match data");
}

RegexMatcher::~RegexMatcher() { pcre2_match_data_free(state_->md); }

bool RegexMatcher::find(std::string_view text, size_t from, size_t& begin, size_t& end) {
  const auto* subject = reinterpret_cast<PCRE2_SPTR>(text.data());
  while (from < text.size()) {
    // The text is valid UTF-8 (checked once by the tokenizer), so PCRE2 need not check it.
    int rc = state_->code->jit
                 ? pcre2_jit_match(state_->code->re, subject, text.size(), from, 0, state_->md, nullptr)
                 : PCRE2_ERROR_JIT_STACKLIMIT;
    if (rc == PCRE2_ERROR_JIT_STACKLIMIT)  // no JIT, or a match deeper than its stack: the interpreter
      rc = pcre2_match(state_->code->re, subject, text.size(), from, PCRE2_NO_UTF_CHECK, state_->md, nullptr);
    if (rc == PCRE2_ERROR_NOMATCH) return false;
    if (rc < 0) {
      PCRE2_UCHAR msg[256];
      pcre2_get_error_message(rc, msg, sizeof msg);
      throw runtime_error(std::string("a tokenizer split pattern failed to match: ") +
                          reinterpret_cast<const char*>(msg));
    }
    const PCRE2_SIZE* ov = pcre2_get_ovector_pointer(state_->md);
    if (ov[1] > ov[0]) {
      begin = ov[0];
      end = ov[1];
      return true;
    }
    // An empty match: Oniguruma's find_iter moves on by one character and tokenizers drops it.
    from = ov[0] + 1;
    while (from < text.size() && (static_cast<unsigned char>(text[from]) & 0xC0) == 0x80) ++from;
  }
  return false;
}

}  // namespace tessera::data
