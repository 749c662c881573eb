#include "tessera/data/hf_unicode.h"

#include <unicode/bytestream.h>
#include <unicode/normalizer2.h>
#include <unicode/uchar.h>

#include "tessera/core/error.h"

namespace tessera::data {
namespace {

const icu::Normalizer2& normalizer_of(UnicodeNormalization form) {
  UErrorCode status = U_ZERO_ERROR;
  const icu::Normalizer2* n = nullptr;
  switch (form) {
    case UnicodeNormalization::NFC: n = icu::Normalizer2::getNFCInstance(status); break;
    case UnicodeNormalization::NFD: n = icu::Normalizer2::getNFDInstance(status); break;
    case UnicodeNormalization::NFKC: n = icu::Normalizer2::getNFKCInstance(status); break;
    case UnicodeNormalization::NFKD: n = icu::Normalizer2::getNFKDInstance(status); break;
  }
  TESSERA_CHECK(U_SUCCESS(status) && n != nullptr, "ICU has no normalizer data");
  return *n;
}

}  // namespace

std::string normalize(const std::vector<UnicodeNormalization>& forms, std::string_view text) {
  std::string current(text);
  for (UnicodeNormalization form : forms) {
    const icu::Normalizer2& n = normalizer_of(form);
    const icu::StringPiece piece(current.data(), static_cast<int32_t>(current.size()));
    UErrorCode status = U_ZERO_ERROR;
    if (n.isNormalizedUTF8(piece, status) && U_SUCCESS(status)) continue;
    status = U_ZERO_ERROR;
    std::string out;
    icu::StringByteSink<std::string> sink(&out, static_cast<int32_t>(current.size()));
    n.normalizeUTF8(0, piece, sink, nullptr, status);
    TESSERA_CHECK(U_SUCCESS(status), "ICU failed to normalize valid UTF-8");
    current = std::move(out);
  }
  return current;
}

bool is_white_space(char32_t c) { return u_hasBinaryProperty(static_cast<UChar32>(c), UCHAR_WHITE_SPACE); }

}  // namespace tessera::data
