// --text-template: builds a document's text from named fields of a record, e.g.
// '{instruction}\n{input}\n{output}' for Alpaca files. The spelling is Python's str.format
// with plain names only: {name} is the field's value, {{ and }} are literal braces; the
// escapes \n, \t, \r and \\ written in the template (as a shell passes them) are turned into
// the characters. Format specs, conversions, attributes and positional fields are rejected.
#pragma once

#include <span>
#include <string>
#include <string_view>
#include <vector>

namespace tessera::data {

class TextTemplate {
 public:
  explicit TextTemplate(std::string_view spec);  // throws a usage Error

  // Distinct field names, in order of first use.
  const std::vector<std::string>& fields() const { return fields_; }
  // values[i] is the value of fields()[i].
  void render(std::span<const std::string_view> values, std::string& out) const;

 private:
  struct Part {
    std::string literal;
    int field = -1;  // index into fields_, or -1 for a literal
  };
  std::vector<Part> parts_;
  std::vector<std::string> fields_;
};

}  // namespace tessera::data
