#include "tessera/data/text_template.h"

#include <algorithm>

#include "tessera/core/error.h"

namespace tessera::data {

TextTemplate::TextTemplate(std::string_view spec) {
  const std::string hint = "write fields as {name}, e.g. --text-template '{instruction}\\n{input}\\n{output}'; "
                           "{{ and }} are literal braces";
  // Escapes first, as a shell leaves them in a single-quoted argument.
  std::string s;
  for (size_t i = 0; i < spec.size(); ++i) {
    if (spec[i] == '\\' && i + 1 < spec.size()) {
      char c = spec[i + 1];
      if (c == 'n') { s += '\n'; ++i; continue; }
      if (c == 't') { s += '\t'; ++i; continue; }
      if (c == 'r') { s += '\r'; ++i; continue; }
      if (c == '\\') { s += '\\'; ++i; continue; }
    }
    s += spec[i];
  }
  std::string literal;
  auto flush = [&] {
    if (!literal.empty()) parts_.push_back(Part{std::move(literal), -1});
    literal.clear();
  };
  for (size_t i = 0; i < s.size(); ++i) {
    char c = s[i];
    if (c == '{' && i + 1 < s.size() && s[i + 1] == '{') { literal += '{'; ++i; continue; }
    if (c == '}' && i + 1 < s.size() && s[i + 1] == '}') { literal += '}'; ++i; continue; }
    if (c == '}') throw usage_error("--text-template: single '}' at position " + std::to_string(i) + " of \"" + std::string(spec) + "\"", hint);
    if (c != '{') { literal += c; continue; }
    size_t close = s.find('}', i + 1);
    if (close == std::string::npos)
      throw usage_error("--text-template: '{' at position " + std::to_string(i) + " is never closed", hint);
    std::string name = s.substr(i + 1, close - i - 1);
    if (name.empty() || name.find_first_of("{:!.[]") != std::string::npos ||
        std::all_of(name.begin(), name.end(), [](char ch) { return ch >= '0' && ch <= '9'; }))
      throw usage_error("--text-template: {" + name + "} is not a plain field name", hint);
    flush();
    auto it = std::find(fields_.begin(), fields_.end(), name);
    int index = static_cast<int>(it - fields_.begin());
    if (it == fields_.end()) fields_.push_back(name);
    parts_.push_back(Part{"", index});
    i = close;
  }
  flush();
  if (fields_.empty()) throw usage_error("--text-template names no field", hint);
}

void TextTemplate::render(std::span<const std::string_view> values, std::string& out) const {
  out.clear();
  for (const Part& p : parts_) {
    if (p.field < 0) out += p.literal;
    else out.append(values[static_cast<size_t>(p.field)]);
  }
}

}  // namespace tessera::data
