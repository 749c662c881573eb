// The split patterns of Hugging Face pre-tokenizers, run by PCRE2 (with its JIT).
//
// tokenizers runs these patterns with Oniguruma. The two engines agree on the constructs the
// Llama-3, Qwen2 and GPT-4-style patterns use (alternation, (?i:...), \p{L}, \p{N},
// lookahead, counted repeats) except `\s`: Oniguruma's is Unicode White_Space, PCRE2's adds
// U+180E, so `\s` and `\S` are rewritten to \p{White_Space} and \P{White_Space}
// (tests/data_area/hf_tokenizer_test.py compares the classes over every code point).
#pragma once

#include <memory>
#include <string>
#include <string_view>

namespace tessera::data {

class RegexPattern {
 public:
  // Compiles `pattern` (Oniguruma syntax as tokenizer.json writes it); `where` names the
  // pattern's origin for the error a pattern PCRE2 cannot compile raises.
  RegexPattern(std::string_view pattern, const std::string& where);
  ~RegexPattern();
  RegexPattern(const RegexPattern&) = delete;
  RegexPattern& operator=(const RegexPattern&) = delete;
  struct Code;
  const Code& code() const { return *code_; }

 private:
  std::unique_ptr<Code> code_;
};

// Finds the matches of one pattern; owns the per-thread match state.
class RegexMatcher {
 public:
  explicit RegexMatcher(const RegexPattern& pattern);
  ~RegexMatcher();
  RegexMatcher(const RegexMatcher&) = delete;
  RegexMatcher& operator=(const RegexMatcher&) = delete;
  // The first non-empty match in text[from..], as [begin, end) offsets; false if none.
  bool find(std::string_view text, size_t from, size_t& begin, size_t& end);

 private:
  struct State;
  std::unique_ptr<State> state_;
};

// `pattern` with \s and \S outside \Q..\E rewritten for PCRE2 (see above).
std::string onig_to_pcre2(std::string_view pattern);

}  // namespace tessera::data
