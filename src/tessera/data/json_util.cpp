#include "tessera/data/json_util.h"

#include <nlohmann/json.hpp>

namespace tessera::data {

TextPosition advance_position(std::string_view text, size_t offset, TextPosition start) {
  TextPosition pos = start;
  if (offset > text.size()) offset = text.size();
  for (size_t i = 0; i < offset; ++i) {
    unsigned char c = static_cast<unsigned char>(text[i]);
    if (c == '\n') {
      ++pos.line;
      pos.column = 1;
    } else if ((c & 0xC0) != 0x80) {
      ++pos.column;
    }
  }
  return pos;
}

bool describe_json_error(std::string_view text, JsonSyntaxError& error) {
  try {
    auto value = nlohmann::json::parse(text.begin(), text.end());
    (void)value;
    return false;
  } catch (const nlohmann::json::parse_error& e) {
    // e.byte is 1-based: the count of bytes read when the error was detected.
    error.offset = e.byte > 0 ? e.byte - 1 : 0;
    std::string msg = e.what();
    // "[json.exception.parse_error.101] parse error at line 1, column 5: syntax error ..."
    if (auto p = msg.find("parse error"); p != std::string::npos) {
      if (auto colon = msg.find(": ", p); colon != std::string::npos) msg = msg.substr(colon + 2);
    }
    error.message = msg;
    return true;
  } catch (const std::exception& e) {
    error.offset = 0;
    error.message = e.what();
    return true;
  }
}

}  // namespace tessera::data
