#include "tessera/ckpt/safetensors.h"

// Depends only on core/error.cpp, core/dtype.cpp and core/mapped_file.cpp (and nlohmann-json),
// so that the fuzz target can compile it alone with sanitizers.

#include <fcntl.h>
#include <unistd.h>

#include <algorithm>
#include <bit>
#include <cerrno>
#include <cstring>
#include <nlohmann/json.hpp>
#include <optional>
#include <set>

#include "tessera/core/file_bytes.h"

namespace tessera::safetensors {

static_assert(std::endian::native == std::endian::little, "safetensors data is little-endian");

namespace {

using json = nlohmann::json;

// Every dtype the format defines, with its element size; `dtype` is empty where tessera has
// no type for it (such tensors are validated, skipped by loaders, and rejected on access).
struct FormatDType {
  const char* name;
  size_t size;
  std::optional<DType> dtype;
};
const FormatDType kFormatDTypes[] = {
    {"F32", 4, DType::F32},  {"F16", 2, DType::F16}, {"BF16", 2, DType::BF16},
    {"I32", 4, DType::I32},  {"I64", 8, DType::I64}, {"U16", 2, DType::U16},
    {"U8", 1, DType::U8},    {"F64", 8, {}},         {"I8", 1, {}},
    {"I16", 2, {}},          {"U32", 4, {}},         {"U64", 8, {}},
    {"BOOL", 1, {}},         {"F8_E4M3", 1, {}},     {"F8_E5M2", 1, {}},
};

const FormatDType* find_format_dtype(std::string_view name) {
  for (const auto& d : kFormatDTypes)
    if (name == d.name) return &d;
  return nullptr;
}

std::string errno_str() { return std::strerror(errno); }

// Strings from the file are quoted and shortened before they go into a message.
std::string quote_name(std::string_view s) {
  constexpr size_t kMax = 80;
  std::string r = "'";
  for (size_t i = 0; i < s.size() && i < kMax; ++i) {
    unsigned char c = static_cast<unsigned char>(s[i]);
    if (c < 0x20 || c == 0x7f) {
      char buf[8];
      std::snprintf(buf, sizeof buf, "\\x%02x", c);
      r += buf;
    } else {
      r += static_cast<char>(c);
    }
  }
  if (s.size() > kMax) r += "...";
  return r + "'";
}

// "[begin, end]" (built with append: GCC 12 warns falsely on the operator+ chain).
std::string range_str(uint64_t begin, uint64_t end) {
  std::string r = "[";
  r.append(std::to_string(begin)).append(", ").append(std::to_string(end)).append("]");
  return r;
}

const char* kCorruptHint = "the file is truncated or corrupt; re-download or re-export it";

}  // namespace

std::optional<DType> dtype_from_name(std::string_view name) {
  const FormatDType* d = find_format_dtype(name);
  return d ? d->dtype : std::nullopt;
}

std::string_view dtype_to_name(DType t) {
  switch (t) {
    case DType::F32: return "F32";
    case DType::F16: return "F16";
    case DType::BF16: return "BF16";
    case DType::I32: return "I32";
    case DType::I64: return "I64";
    case DType::U16: return "U16";
    case DType::U8: return "U8";
  }
  return "?";
}

// ---------------------------------------------------------------------------------------------
// Reader

Reader::Reader(std::string label, FileBytes file) : label_(std::move(label)), file_(std::move(file)) { parse(); }

Reader Reader::open(const std::string& path) { return Reader(path, FileBytes::map(path)); }

Reader Reader::from_bytes(std::string label, std::vector<uint8_t> bytes) {
  return Reader(std::move(label), FileBytes::own(std::move(bytes)));
}

namespace {

// The steps of Reader::parse, in file order. `f` names the file in every message.

// The 8-byte header length, checked against the limit and the file before anything reads past it.
uint64_t header_length(const std::string& f, std::span<const uint8_t> file) {
  if (file.size() < 8)
    throw runtime_error(f + ": truncated safetensors file: " + std::to_string(file.size()) +
                            " bytes, the 8-byte header length alone needs 8",
                        kCorruptHint);
  uint64_t header_len = 0;
  std::memcpy(&header_len, file.data(), 8);
  if (header_len > kMaxHeaderBytes)
    throw runtime_error(f + ": safetensors header length " + std::to_string(header_len) +
                            " exceeds the limit of " + std::to_string(kMaxHeaderBytes) + " bytes",
                        std::string("this is not a safetensors file, or ") + kCorruptHint);
  if (header_len > file.size() - 8)
    throw runtime_error(f + ": safetensors header length " + std::to_string(header_len) +
                            " runs past the end of the file (" + std::to_string(file.size()) +
                            " bytes)",
                        std::string("this is not a safetensors file, or ") + kCorruptHint);
  if (header_len < 2)
    throw runtime_error(f + ": safetensors header of " + std::to_string(header_len) +
                            " bytes cannot hold a JSON object",
                        kCorruptHint);
  return header_len;
}

// Duplicate keys would make a tensor ambiguous; nlohmann keeps the last silently, so the
// parser's callback tracks the keys of every open object and remembers the first repeat.
class DuplicateKeyFinder {
 public:
  bool on_event(json::parse_event_t ev, const json& parsed) {
    switch (ev) {
      case json::parse_event_t::object_start: open_objects_.emplace_back(); break;
      case json::parse_event_t::object_end:
        if (!open_objects_.empty()) open_objects_.pop_back();
        break;
      case json::parse_event_t::key:
        if (!open_objects_.empty() && parsed.is_string() &&
            !open_objects_.back().insert(parsed.get_ref<const std::string&>()).second && first_.empty())
          first_ = parsed.get<std::string>();
        break;
      default: break;
    }
    return true;
  }
  const std::string& first() const { return first_; }

 private:
  std::vector<std::set<std::string>> open_objects_;
  std::string first_;
};

// The JSON header: one object, no key repeated at any depth.
json parse_header_json(const std::string& f, std::string_view text) {
  if (text.front() != '{')
    throw runtime_error(f + ": safetensors header does not start with '{'",
                        std::string("this is not a safetensors file, or ") + kCorruptHint);
  DuplicateKeyFinder duplicates;
  json::parser_callback_t cb = [&](int, json::parse_event_t ev, json& parsed) {
    return duplicates.on_event(ev, parsed);
  };
  json header;
  try {
    header = json::parse(text.begin(), text.end(), cb, /*allow_exceptions=*/true, /*ignore_comments=*/false);
  } catch (const json::exception& e) {
    throw runtime_error(f + ": safetensors header is not valid JSON: " + e.what(), kCorruptHint);
  }
  if (!header.is_object())
    throw runtime_error(f + ": safetensors header is not a JSON object", kCorruptHint);
  if (!duplicates.first().empty())
    throw runtime_error(f + ": safetensors header repeats the key " + quote_name(duplicates.first()),
                        kCorruptHint);
  return header;
}

std::map<std::string, std::string> read_metadata(const std::string& f, const json& v) {
  if (!v.is_object()) throw runtime_error(f + ": __metadata__ is not a JSON object", kCorruptHint);
  std::map<std::string, std::string> metadata;
  for (auto m = v.begin(); m != v.end(); ++m) {
    if (!m.value().is_string())
      throw runtime_error(f + ": __metadata__ value for " + quote_name(m.key()) + " is not a string",
                          kCorruptHint);
    metadata[m.key()] = m.value().get<std::string>();
  }
  return metadata;
}

// The fields of one tensor entry, present and of the right JSON type; `where` names the tensor.
struct EntryFields {
  const json& dtype;
  const json& shape;
  const json& data_offsets;
};

EntryFields entry_fields(const std::string& where, const json& v) {
  if (!v.is_object()) throw runtime_error(where + "entry is not a JSON object", kCorruptHint);
  auto dt = v.find("dtype");
  auto sh = v.find("shape");
  auto off = v.find("data_offsets");
  if (dt == v.end() || !dt->is_string())
    throw runtime_error(where + "missing or non-string \"dtype\"", kCorruptHint);
  if (sh == v.end() || !sh->is_array())
    throw runtime_error(where + "missing or non-array \"shape\"", kCorruptHint);
  if (off == v.end() || !off->is_array() || off->size() != 2)
    throw runtime_error(where + "\"data_offsets\" is not an array of two offsets", kCorruptHint);
  return {*dt, *sh, *off};
}

const FormatDType& entry_dtype(const std::string& where, const std::string& name) {
  const FormatDType* fd = find_format_dtype(name);
  if (!fd)
    throw runtime_error(where + "unknown dtype " + quote_name(name),
                        "safetensors dtypes are F64 F32 F16 BF16 I64 I32 I16 I8 U64 U32 U16 U8 "
                        "BOOL F8_E4M3 F8_E5M2");
  return *fd;
}

// Fills t.shape and t.numel from the "shape" array, refusing negative dimensions and any
// product (elements, then bytes) past 64 bits; returns the tensor's size in bytes.
uint64_t read_shape(const std::string& where, const json& sh, TensorInfo& t) {
  uint64_t numel = 1;
  for (const json& d : sh) {
    if (!d.is_number_unsigned())
      throw runtime_error(where + "shape " + sh.dump() + " has a dimension that is not a non-negative integer",
                          kCorruptHint);
    uint64_t dim = d.get<uint64_t>();
    if (dim > static_cast<uint64_t>(INT64_MAX) || __builtin_mul_overflow(numel, dim, &numel))
      throw runtime_error(where + "shape " + sh.dump() + " overflows 64 bits", kCorruptHint);
    t.shape.push_back(static_cast<int64_t>(dim));
  }
  uint64_t nbytes = 0;
  if (numel > static_cast<uint64_t>(INT64_MAX) ||
      __builtin_mul_overflow(numel, static_cast<uint64_t>(t.element_size), &nbytes))
    throw runtime_error(where + "shape " + sh.dump() + " with dtype " + t.dtype_name + " overflows 64 bits",
                        kCorruptHint);
  t.numel = numel;
  return nbytes;
}

// Fills t.begin and t.end from "data_offsets": in order, inside the data section of
// `data_size` bytes, and exactly `nbytes` apart.
void read_data_offsets(const std::string& where, const json& off, const json& sh, uint64_t data_size,
                       uint64_t nbytes, TensorInfo& t) {
  for (const json& o : off)
    if (!o.is_number_unsigned())
      throw runtime_error(where + "data_offsets " + off.dump() + " are not non-negative integers", kCorruptHint);
  t.begin = off[0].get<uint64_t>();
  t.end = off[1].get<uint64_t>();
  const std::string offs = range_str(t.begin, t.end);
  if (t.begin > t.end) throw runtime_error(where + "data_offsets " + offs + " begin after end", kCorruptHint);
  if (t.end > data_size)
    throw runtime_error(where + "data_offsets " + offs + " run past the data section (" +
                            std::to_string(data_size) + " bytes)",
                        kCorruptHint);
  if (t.end - t.begin != nbytes)
    throw runtime_error(where + "data_offsets " + offs + " hold " + std::to_string(t.end - t.begin) + " bytes but " +
                            t.dtype_name + " " + sh.dump() + " needs " + std::to_string(nbytes),
                        kCorruptHint);
}

// One tensor's header entry, validated against a data section of `data_size` bytes.
TensorInfo read_tensor_entry(const std::string& f, const std::string& name, const json& v, uint64_t data_size) {
  const std::string where = f + ": tensor " + quote_name(name) + ": ";
  const EntryFields fields = entry_fields(where, v);
  TensorInfo t;
  t.name = name;
  t.dtype_name = fields.dtype.get<std::string>();
  const FormatDType& fd = entry_dtype(where, t.dtype_name);
  t.dtype = fd.dtype;
  t.element_size = fd.size;
  const uint64_t nbytes = read_shape(where, fields.shape, t);
  read_data_offsets(where, fields.data_offsets, fields.shape, data_size, nbytes, t);
  return t;
}

}  // namespace

void Reader::parse() {
  const uint64_t header_len = header_length(label_, file_.bytes());
  data_offset_ = 8 + header_len;
  const uint64_t data_size = file_.size() - data_offset_;
  const json header =
      parse_header_json(label_, std::string_view(reinterpret_cast<const char*>(file_.data() + 8), header_len));
  for (auto it = header.begin(); it != header.end(); ++it) {
    if (it.key() == "__metadata__")
      metadata_ = read_metadata(label_, it.value());
    else
      tensors_.push_back(read_tensor_entry(label_, it.key(), it.value(), data_size));
  }
  std::stable_sort(tensors_.begin(), tensors_.end(), [](const TensorInfo& a, const TensorInfo& b) {
    return a.begin < b.begin;
  });
  for (size_t i = 0; i < tensors_.size(); ++i) index_[tensors_[i].name] = i;
}

const TensorInfo* Reader::find(const std::string& name) const {
  auto it = index_.find(name);
  return it == index_.end() ? nullptr : &tensors_[it->second];
}

const TensorInfo& Reader::at(const std::string& name) const {
  const TensorInfo* t = find(name);
  if (!t)
    throw runtime_error(label_ + ": no tensor named " + quote_name(name),
                        "list the file's tensors to see what it holds");
  return *t;
}

std::span<const uint8_t> Reader::bytes(const TensorInfo& t) const {
  // parse() guaranteed begin <= end <= data size; re-check in case `t` came from elsewhere.
  TESSERA_CHECK(t.begin <= t.end && t.end <= file_.size() - data_offset_,
                "tensor info does not belong to " + label_);
  return {file_.data() + data_offset_ + t.begin, static_cast<size_t>(t.end - t.begin)};
}

void Reader::drop_pages(const TensorInfo& t) const {
  const std::span<const uint8_t> b = bytes(t);
  file_.drop_pages(static_cast<uint64_t>(b.data() - file_.data()), b.size());
}

std::vector<float> Reader::read_f32(const TensorInfo& t) const {
  std::span<const uint8_t> b = bytes(t);
  std::vector<float> out(t.numel);
  if (t.dtype == DType::F32) {
    if (!b.empty()) std::memcpy(out.data(), b.data(), b.size());
  } else if (t.dtype == DType::F16 || t.dtype == DType::BF16) {
    const bool bf = t.dtype == DType::BF16;
    for (uint64_t i = 0; i < t.numel; ++i) {
      uint16_t h;
      std::memcpy(&h, b.data() + 2 * i, 2);
      out[i] = bf ? bf16_to_f32(h) : f16_to_f32(h);
    }
  } else {
    throw runtime_error(label_ + ": tensor " + quote_name(t.name) + " has dtype " + t.dtype_name +
                            ", expected a floating-point dtype (F32, F16 or BF16)",
                        "convert the checkpoint to F32, F16 or BF16");
  }
  return out;
}

std::vector<int64_t> Reader::read_i64(const TensorInfo& t) const {
  std::span<const uint8_t> b = bytes(t);
  std::vector<int64_t> out(t.numel);
  auto widen = [&]<typename T>(T) {
    for (uint64_t i = 0; i < t.numel; ++i) {
      T v;
      std::memcpy(&v, b.data() + sizeof(T) * i, sizeof(T));
      out[i] = static_cast<int64_t>(v);
    }
  };
  if (t.dtype == DType::I32) widen(int32_t{});
  else if (t.dtype == DType::I64) widen(int64_t{});
  else if (t.dtype == DType::U16) widen(uint16_t{});
  else if (t.dtype == DType::U8) widen(uint8_t{});
  else
    throw runtime_error(label_ + ": tensor " + quote_name(t.name) + " has dtype " + t.dtype_name +
                        ", expected an integer dtype (I32, I64, U16 or U8)");
  return out;
}

// ---------------------------------------------------------------------------------------------
// Writer

namespace {

// The header bytes (length prefix included, padded with spaces to a multiple of 8) and the
// data-section size for `entries`; `with_data`: each entry must point at its bytes.
std::vector<uint8_t> build_header(const std::vector<WriteEntry>& entries,
                                  const std::map<std::string, std::string>& metadata,
                                  uint64_t* data_size, bool with_data = true) {
  nlohmann::ordered_json h = nlohmann::ordered_json::object();
  if (!metadata.empty()) {
    nlohmann::ordered_json m = nlohmann::ordered_json::object();
    for (const auto& [k, v] : metadata) m[k] = v;
    h["__metadata__"] = std::move(m);
  }
  uint64_t offset = 0;
  std::set<std::string_view> names;
  for (const WriteEntry& e : entries) {
    if (e.name == "__metadata__")
      throw usage_error("safetensors: the tensor name __metadata__ is reserved");
    if (!names.insert(e.name).second)
      throw usage_error("safetensors: tensor " + quote_name(e.name) + " is written twice");
    uint64_t numel = 1;
    nlohmann::ordered_json shape = nlohmann::ordered_json::array();
    for (int64_t d : e.shape) {
      if (d < 0)
        throw usage_error("safetensors: tensor " + quote_name(e.name) + " has a negative dimension " +
                          std::to_string(d));
      numel *= static_cast<uint64_t>(d);
      shape.push_back(static_cast<uint64_t>(d));
    }
    uint64_t nbytes = numel * dtype_size(e.dtype);
    if (with_data && nbytes > 0 && e.data == nullptr)
      throw usage_error("safetensors: tensor " + quote_name(e.name) + " has no data");
    nlohmann::ordered_json t = nlohmann::ordered_json::object();
    t["dtype"] = std::string(dtype_to_name(e.dtype));
    t["shape"] = std::move(shape);
    t["data_offsets"] = {offset, offset + nbytes};
    h[e.name] = std::move(t);
    offset += nbytes;
  }
  std::string text;
  try {
    text = h.dump();
  } catch (const nlohmann::json::exception& e) {
    throw usage_error(std::string("safetensors: cannot encode the header: ") + e.what(),
                      "tensor names and metadata must be valid UTF-8");
  }
  text.append((8 - text.size() % 8) % 8, ' ');
  uint64_t n = text.size();
  std::vector<uint8_t> out(8 + text.size());
  std::memcpy(out.data(), &n, 8);
  std::memcpy(out.data() + 8, text.data(), text.size());
  *data_size = offset;
  return out;
}

size_t entry_bytes(const WriteEntry& e) {
  int64_t n = 1;
  for (int64_t d : e.shape) n *= d;
  return static_cast<size_t>(n) * dtype_size(e.dtype);
}

void write_all(int fd, const void* data, size_t n, const std::string& path) {
  const char* p = static_cast<const char*>(data);
  while (n > 0) {
    ssize_t w = ::write(fd, p, std::min<size_t>(n, 1u << 30));
    if (w < 0) {
      if (errno == EINTR) continue;
      throw runtime_error(path + ": write failed: " + errno_str(),
                          "check free disk space and permissions");
    }
    p += w;
    n -= static_cast<size_t>(w);
  }
}

}  // namespace

std::vector<uint8_t> serialize(const std::vector<WriteEntry>& entries,
                               const std::map<std::string, std::string>& metadata) {
  uint64_t data_size = 0;
  std::vector<uint8_t> out = build_header(entries, metadata, &data_size);
  out.reserve(out.size() + data_size);
  for (const WriteEntry& e : entries) {
    const uint8_t* p = static_cast<const uint8_t*>(e.data);
    out.insert(out.end(), p, p + entry_bytes(e));
  }
  return out;
}

std::vector<uint8_t> serialize_header(const std::vector<WriteEntry>& entries,
                                      const std::map<std::string, std::string>& metadata) {
  uint64_t data_size = 0;
  return build_header(entries, metadata, &data_size, false);
}

void write(const std::string& path, const std::vector<WriteEntry>& entries,
           const std::map<std::string, std::string>& metadata) {
  uint64_t data_size = 0;
  std::vector<uint8_t> header = build_header(entries, metadata, &data_size);
  const std::string tmp = path + ".tmp." + std::to_string(getpid());
  int fd = ::open(tmp.c_str(), O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0644);
  if (fd < 0)
    throw runtime_error(tmp + ": cannot create: " + errno_str(),
                        "check that the directory exists and is writable");
  try {
    write_all(fd, header.data(), header.size(), tmp);
    for (const WriteEntry& e : entries) write_all(fd, e.data, entry_bytes(e), tmp);
    if (fsync(fd) != 0) throw runtime_error(tmp + ": fsync failed: " + errno_str());
    int rc = ::close(fd);
    fd = -1;
    if (rc != 0) throw runtime_error(tmp + ": close failed: " + errno_str());
    if (std::rename(tmp.c_str(), path.c_str()) != 0)
      throw runtime_error(path + ": cannot rename " + tmp + " into place: " + errno_str());
  } catch (...) {
    if (fd >= 0) ::close(fd);
    ::unlink(tmp.c_str());
    throw;
  }
  // Make the rename durable.
  std::string dir = ".";
  if (auto slash = path.rfind('/'); slash != std::string::npos) dir = slash == 0 ? "/" : path.substr(0, slash);
  int dfd = ::open(dir.c_str(), O_RDONLY | O_DIRECTORY | O_CLOEXEC);
  if (dfd >= 0) {
    fsync(dfd);
    ::close(dfd);
  }
}

}  // namespace tessera::safetensors
