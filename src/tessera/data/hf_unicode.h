// Unicode normalization (ICU) for the Hugging Face tokenizer's normalizers.
#pragma once

#include <string>
#include <string_view>
#include <vector>

namespace tessera::data {

enum class UnicodeNormalization : unsigned char { NFC, NFD, NFKC, NFKD };

// `text` (valid UTF-8) after each normalization form in turn.
std::string normalize(const std::vector<UnicodeNormalization>& forms, std::string_view text);

// Rust's char::is_whitespace: the Unicode White_Space property.
bool is_white_space(char32_t c);

}  // namespace tessera::data
