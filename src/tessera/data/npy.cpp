#include "tessera/data/npy.h"

#include <cctype>
#include <optional>

#include "tessera/core/error.h"
#include "tessera/data/file_util.h"
#include "tessera/data/indexed_dataset.h"

namespace tessera::data {

namespace {

constexpr char kMagic[6] = {'\x93', 'N', 'U', 'M', 'P', 'Y'};
constexpr size_t kArrayAlign = 64;
constexpr size_t kGrowthAxisMaxDigits = 21;

struct DTypeInfo {
  NpyDType dtype;
  const char* descr;
  size_t size;
};
constexpr DTypeInfo kDTypes[] = {
    {NpyDType::Int8, "|i1", 1},   {NpyDType::UInt8, "|u1", 1},  {NpyDType::Int16, "<i2", 2},
    {NpyDType::UInt16, "<u2", 2}, {NpyDType::Int32, "<i4", 4},  {NpyDType::UInt32, "<u4", 4},
    {NpyDType::Int64, "<i8", 8},  {NpyDType::UInt64, "<u8", 8},
};

const DTypeInfo& info(NpyDType d) {
  for (const auto& i : kDTypes)
    if (i.dtype == d) return i;
  TESSERA_CHECK(false, "unknown NpyDType");
  return kDTypes[0];
}

// Python's repr of a shape tuple: "(24,)", "(29, 2)", "()".
std::string shape_repr(std::span<const int64_t> shape) {
  std::string s = "(";
  for (size_t i = 0; i < shape.size(); ++i) {
    if (i) s += ", ";
    s += std::to_string(shape[i]);
  }
  if (shape.size() == 1) s += ",";
  return s + ")";
}

uint64_t element_count(std::span<const int64_t> shape) {
  uint64_t n = 1;
  for (int64_t d : shape) n *= static_cast<uint64_t>(d);
  return n;
}

// A parser for the header dict numpy writes: {'descr': '<i4', 'fortran_order': False,
// 'shape': (29, 2), } (keys in any order, either quote style, optional trailing commas).
class HeaderParser {
 public:
  HeaderParser(std::string_view text, const std::string& path) : s_(text), path_(path) {}

  void parse(std::string& descr, bool& fortran, std::vector<int64_t>& shape) {
    bool have_descr = false, have_fortran = false, have_shape = false;
    expect('{');
    for (;;) {
      skip_ws();
      if (peek() == '}') break;
      std::string key = string_literal();
      expect(':');
      skip_ws();
      if (key == "descr") {
        descr = string_literal();
        have_descr = true;
      } else if (key == "fortran_order") {
        fortran = boolean();
        have_fortran = true;
      } else if (key == "shape") {
        shape = tuple();
        have_shape = true;
      } else {
        fail("unexpected key '" + key + "'");
      }
      skip_ws();
      if (peek() == ',') {
        ++i_;
        continue;
      }
      skip_ws();
      if (peek() != '}') fail("expected ',' or '}'");
    }
    if (!have_descr || !have_fortran || !have_shape) fail("missing 'descr', 'fortran_order' or 'shape'");
  }

 private:
  char peek() const { return i_ < s_.size() ? s_[i_] : '\0'; }
  void skip_ws() {
    while (i_ < s_.size() && std::isspace(static_cast<unsigned char>(s_[i_]))) ++i_;
  }
  void expect(char c) {
    skip_ws();
    if (peek() != c) fail(std::string("expected '") + c + "'");
    ++i_;
  }
  std::string string_literal() {
    skip_ws();
    char q = peek();
    if (q != '\'' && q != '"') fail("expected a string");
    size_t end = s_.find(q, i_ + 1);
    if (end == std::string_view::npos) fail("unterminated string");
    std::string out(s_.substr(i_ + 1, end - i_ - 1));
    i_ = end + 1;
    return out;
  }
  bool boolean() {
    if (s_.substr(i_, 4) == "True") {
      i_ += 4;
      return true;
    }
    if (s_.substr(i_, 5) == "False") {
      i_ += 5;
      return false;
    }
    fail("expected True or False");
    return false;
  }
  std::vector<int64_t> tuple() {
    std::vector<int64_t> out;
    expect('(');
    for (;;) {
      skip_ws();
      if (peek() == ')') {
        ++i_;
        return out;
      }
      if (!std::isdigit(static_cast<unsigned char>(peek()))) fail("expected a dimension");
      int64_t v = 0;
      while (std::isdigit(static_cast<unsigned char>(peek()))) {
        if (v > (INT64_MAX - 9) / 10) fail("dimension too large");
        v = v * 10 + (s_[i_++] - '0');
      }
      if (peek() == 'L') ++i_;  // Python 2 longs
      out.push_back(v);
      skip_ws();
      if (peek() == ',') ++i_;
    }
  }
  [[noreturn]] void fail(const std::string& what) const {
    throw runtime_error(path_ + ": malformed .npy header: " + what,
                        "delete the file (a dataset cache file is rebuilt on the next run)");
  }
  std::string_view s_;
  const std::string& path_;
  size_t i_ = 0;
};

}  // namespace

std::string_view npy_descr(NpyDType dtype) { return info(dtype).descr; }
size_t npy_itemsize(NpyDType dtype) { return info(dtype).size; }

std::string npy_header(NpyDType dtype, std::span<const int64_t> shape) {
  std::string dict = "{'descr': '" + std::string(npy_descr(dtype)) + "', 'fortran_order': False, 'shape': " +
                     shape_repr(shape) + ", }";
  if (!shape.empty()) {
    size_t digits = std::to_string(shape[0]).size();
    if (digits < kGrowthAxisMaxDigits) dict.append(kGrowthAxisMaxDigits - digits, ' ');
  }
  size_t hlen = dict.size() + 1;  // + '\n'
  size_t padlen = kArrayAlign - ((sizeof(kMagic) + 2 + 2 + hlen) % kArrayAlign);
  size_t total_len = hlen + padlen;
  TESSERA_CHECK(total_len <= 0xffff, "npy header too long for format 1.0");
  std::string out(kMagic, sizeof(kMagic));
  out += '\x01';
  out += '\x00';
  out += static_cast<char>(total_len & 0xff);
  out += static_cast<char>(total_len >> 8);
  out += dict;
  out.append(padlen, ' ');
  out += '\n';
  return out;
}

std::vector<int64_t> NpyArray::to_int64() const {
  std::vector<int64_t> out(size_);
  for (uint64_t i = 0; i < size_; ++i) out[i] = at(i);
  return out;
}

void write_npy(const std::string& path, const NpyArray& array) {
  TESSERA_CHECK(element_count(array.shape()) == array.size(), "npy shape does not match the element count");
  install_temp_file_cleanup();
  AtomicFile out(path);
  std::string header = npy_header(array.dtype(), array.shape());
  out.write(header.data(), header.size());
  auto bytes = array.bytes();
  if (!bytes.empty()) out.write(bytes.data(), bytes.size());
  out.commit();
}

NpyArray read_npy(const std::string& path) {
  auto file = std::make_shared<MappedFile>(path);
  auto bytes = file->bytes();
  const std::string hint = "delete the file (a dataset cache file is rebuilt on the next run)";
  if (bytes.size() < 10 || std::memcmp(bytes.data(), kMagic, sizeof(kMagic)) != 0)
    throw runtime_error(path + ": not a .npy file (bad magic or shorter than 10 bytes)", hint);
  uint8_t major = bytes[6];
  size_t prefix = 0, header_len = 0;
  if (major == 1) {
    header_len = bytes[8] | (static_cast<size_t>(bytes[9]) << 8);
    prefix = 10;
  } else if (major == 2 || major == 3) {
    if (bytes.size() < 12) throw runtime_error(path + ": truncated .npy header", hint);
    header_len = bytes[8] | (static_cast<size_t>(bytes[9]) << 8) | (static_cast<size_t>(bytes[10]) << 16) |
                 (static_cast<size_t>(bytes[11]) << 24);
    prefix = 12;
  } else {
    throw runtime_error(path + ": unsupported .npy version " + std::to_string(major), hint);
  }
  if (prefix + header_len > bytes.size()) throw runtime_error(path + ": truncated .npy header", hint);
  std::string_view header(reinterpret_cast<const char*>(bytes.data()) + prefix, header_len);
  std::string descr;
  bool fortran = false;
  std::vector<int64_t> shape;
  HeaderParser(header, path).parse(descr, fortran, shape);
  std::optional<NpyDType> dtype;
  for (const auto& i : kDTypes) {
    if (descr == i.descr || (i.size == 1 && descr.size() == 3 && descr.substr(1) == std::string(i.descr + 1) &&
                             (descr[0] == '<' || descr[0] == '>' || descr[0] == '='))) {
      dtype = i.dtype;
    }
  }
  if (!dtype) throw runtime_error(path + ": unsupported .npy dtype '" + descr + "' (little-endian integers only)", hint);
  if (fortran && shape.size() > 1) throw runtime_error(path + ": Fortran-order .npy arrays are not supported", hint);
  uint64_t count = element_count(shape);
  uint64_t data_offset = prefix + header_len;
  uint64_t expected = data_offset + count * npy_itemsize(*dtype);
  if (bytes.size() != expected)
    throw runtime_error(path + ": .npy file is " + std::to_string(bytes.size()) + " bytes but its header (" +
                            std::string(npy_descr(*dtype)) + ", shape " + shape_repr(shape) + ") needs " +
                            std::to_string(expected) + " (truncated or corrupt)",
                        hint);
  NpyArray a;
  a.data_ = bytes.data() + data_offset;
  a.size_ = count;
  a.dtype_ = *dtype;
  a.shape_ = std::move(shape);
  a.path_ = path;
  a.owner_ = std::move(file);
  return a;
}

}  // namespace tessera::data
