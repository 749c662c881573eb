#include "tessera/data/gpt2_pretokenizer.h"

#define PCRE2_CODE_UNIT_WIDTH 8
#include <pcre2.h>
#include <unicode/uchar.h>

#include <memory>
#include <mutex>

#include "tessera/core/error.h"

namespace tessera::data {

const CharClass* gpt2_char_classes() {
  static std::unique_ptr<CharClass[]> table;
  static std::once_flag once;
  std::call_once(once, [] {
    table = std::make_unique<CharClass[]>(0x110000);
    for (UChar32 c = 0; c < 0x110000; ++c) {
      CharClass k = CharClass::Other;
      if (c >= 0xD800 && c <= 0xDFFF) {
        k = CharClass::Other;
      } else if (u_hasBinaryProperty(c, UCHAR_WHITE_SPACE)) {
        k = CharClass::Space;
      } else {
        uint32_t mask = U_GET_GC_MASK(c);
        if (mask & U_GC_L_MASK) k = CharClass::Letter;
        else if (mask & U_GC_N_MASK) k = CharClass::Number;
      }
      table[c] = k;
    }
  });
  return table.get();
}

std::vector<std::string_view> gpt2_pretokenize_regex(std::string_view text) {
  static const char* kPattern =
      "'s|'t|'re|'ve|'m|'ll|'d| ?\\p{L}+| ?\\p{N}+| ?[^\\p{White_Space}\\p{L}\\p{N}]+"
      "|\\p{White_Space}+(?!\\P{White_Space})|\\p{White_Space}+";
  int code = 0;
  PCRE2_SIZE offset = 0;
  std::unique_ptr<pcre2_code, decltype(&pcre2_code_free)> re(
      pcre2_compile(reinterpret_cast<PCRE2_SPTR>(kPattern), PCRE2_ZERO_TERMINATED,
                    PCRE2_UTF | PCRE2_UCP, &code, &offset, nullptr),
      pcre2_code_free);
  TESSERA_CHECK(re != nullptr, "GPT-2 pattern does not compile");
  std::unique_ptr<pcre2_match_data, decltype(&pcre2_match_data_free)> md(
      pcre2_match_data_create_from_pattern(re.get(), nullptr), pcre2_match_data_free);
  std::vector<std::string_view> out;
  size_t pos = 0;
  uint32_t options = 0;
  while (pos < text.size()) {
    int rc = pcre2_match(re.get(), reinterpret_cast<PCRE2_SPTR>(text.data()), text.size(), pos,
                         options, md.get(), nullptr);
    if (rc == PCRE2_ERROR_NOMATCH) break;
    if (rc < 0) throw runtime_error("PCRE2 match failed with code " + std::to_string(rc));
    options = PCRE2_NO_UTF_CHECK;
    PCRE2_SIZE* ov = pcre2_get_ovector_pointer(md.get());
    out.emplace_back(text.data() + ov[0], ov[1] - ov[0]);
    pos = ov[1];
  }
  return out;
}

}  // namespace tessera::data
