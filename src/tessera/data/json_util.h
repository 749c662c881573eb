// Small helpers shared by the JSON readers: positions and messages for errors.
#pragma once

#include <cstddef>
#include <cstdint>
#include <string>
#include <string_view>

namespace tessera::data {

struct TextPosition {
  uint64_t line = 1;    // 1-based
  uint64_t column = 1;  // 1-based, in characters (code points), like Python's json errors
};

// Position of byte `offset` of `text`, counting from `start` (the position of text[0]).
TextPosition advance_position(std::string_view text, size_t offset, TextPosition start = {});

struct JsonSyntaxError {
  size_t offset = 0;    // byte offset in the text where the error was detected
  std::string message;  // without position
};

// Describes why `text` is not one valid JSON value (nlohmann's parser, which reports where).
// Returns false if nlohmann accepts the text.
bool describe_json_error(std::string_view text, JsonSyntaxError& error);

}  // namespace tessera::data
