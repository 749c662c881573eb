#include "tessera/ckpt/torch_file.h"

#include <algorithm>
#include <cstring>

#include "tessera/core/dtype.h"
#include "tessera/core/error.h"

namespace tessera {
namespace {

template <class T>
T load(const uint8_t* p) {
  T v;
  std::memcpy(&v, p, sizeof v);
  return v;
}

// One element of a storage as double (every integer a checkpoint holds fits exactly).
double element(const std::string& type, const uint8_t* p) {
  if (type == "FloatStorage") return load<float>(p);
  if (type == "DoubleStorage") return load<double>(p);
  if (type == "HalfStorage") return f16_to_f32(load<uint16_t>(p));
  if (type == "BFloat16Storage") return bf16_to_f32(load<uint16_t>(p));
  if (type == "LongStorage") return static_cast<double>(load<int64_t>(p));
  if (type == "IntStorage") return load<int32_t>(p);
  if (type == "ShortStorage") return load<int16_t>(p);
  if (type == "CharStorage") return load<int8_t>(p);
  return *p;  // Byte, Bool
}

}  // namespace

size_t storage_element_size(const std::string& type) {
  if (type == "DoubleStorage" || type == "LongStorage") return 8;
  if (type == "FloatStorage" || type == "IntStorage") return 4;
  if (type == "HalfStorage" || type == "BFloat16Storage" || type == "ShortStorage") return 2;
  if (type == "CharStorage" || type == "ByteStorage" || type == "BoolStorage") return 1;
  return 0;
}

TorchFile::TorchFile(zip::Reader zip) : zip_(std::move(zip)) {
  for (const zip::Entry& e : zip_.entries()) {
    const size_t slash = e.name.find('/');
    if (slash != std::string::npos && e.name.substr(slash) == "/data.pkl") {
      archive_ = e.name.substr(0, slash);
      break;
    }
  }
  const zip::Entry* pkl = zip_.find(archive_ + "/data.pkl");
  if (!pkl)
    throw runtime_error(path() + " is a zip archive without <archive>/data.pkl: not a PyTorch checkpoint",
                        "Megatron-LM's --ckpt-format torch writes model_optim_rng.pt files in PyTorch's zip format");
  const std::vector<uint8_t> bytes = zip_.read(*pkl);
  doc_ = pickle::unpickle(bytes, path());
}

TorchFile TorchFile::open(const std::string& path) { return TorchFile(zip::Reader::open(path)); }

TorchFile TorchFile::from_view(std::string label, std::span<const uint8_t> bytes, std::shared_ptr<const void> owner) {
  return TorchFile(zip::Reader::from_view(std::move(label), bytes, std::move(owner)));
}

TorchFile TorchFile::from_bytes(std::string label, std::vector<uint8_t> bytes) {
  return TorchFile(zip::Reader::from_bytes(std::move(label), std::move(bytes)));
}

std::span<const uint8_t> TorchFile::storage_for(const pickle::TensorRef& t, const std::string& what) const {
  const std::string name = archive_ + "/data/" + t.storage.key;
  const zip::Entry* e = zip_.find(name);
  if (!e) throw runtime_error(path() + ": tensor " + what + " names storage " + t.storage.key + ", which the file lacks");
  const size_t es = storage_element_size(t.storage.type);
  if (es == 0) throw runtime_error(path() + ": tensor " + what + " has storage type " + t.storage.type);
  std::span<const uint8_t> data;
  if (e->method == 0) {
    data = zip_.stored(*e);
    if (!crc_checked_[name]) zip_.check_crc(*e, data);
    crc_checked_[name] = true;
  } else {
    auto it = inflated_.find(name);
    if (it == inflated_.end()) it = inflated_.emplace(name, zip_.read(*e)).first;
    data = it->second;
  }
  // The tensor's elements, and the furthest one it reaches, must lie inside the storage's
  // bytes (a saved tensor never repeats elements through zero strides).
  unsigned __int128 numel = 1;
  for (int64_t d : t.shape) numel = std::min<unsigned __int128>(numel * static_cast<uint64_t>(d), uint64_t{1} << 62);
  if (numel * es > data.size())
    throw runtime_error(path() + ": tensor " + what + " has more elements than its storage " + t.storage.key +
                            " holds (" + std::to_string(data.size()) + " bytes)",
                        "the file is damaged or was not written by PyTorch");
  bool empty = false;
  unsigned __int128 last = static_cast<unsigned __int128>(t.storage_offset);
  for (size_t d = 0; d < t.shape.size(); ++d) {
    if (t.shape[d] == 0) empty = true;
    else last += static_cast<unsigned __int128>(t.shape[d] - 1) * static_cast<uint64_t>(t.stride[d]);
  }
  if (!empty && (last + 1) * es > data.size())
    throw runtime_error(path() + ": tensor " + what + " reaches past the end of its storage " + t.storage.key + " (" +
                            std::to_string(data.size()) + " bytes)",
                        "the file is damaged or was not written by PyTorch");
  return data;
}

template <class Out>
std::vector<Out> TorchFile::convert(const pickle::TensorRef& t, const std::string& what) const {
  std::span<const uint8_t> data = storage_for(t, what);
  const size_t es = storage_element_size(t.storage.type);
  int64_t numel = 1;
  for (int64_t d : t.shape) numel *= d;
  std::vector<Out> out(static_cast<size_t>(numel));
  std::vector<int64_t> index(t.shape.size(), 0);
  for (int64_t i = 0; i < numel; ++i) {  // row-major walk, any strides
    int64_t at = t.storage_offset;
    for (size_t d = 0; d < index.size(); ++d) at += index[d] * t.stride[d];
    out[static_cast<size_t>(i)] = static_cast<Out>(element(t.storage.type, data.data() + static_cast<size_t>(at) * es));
    for (size_t d = index.size(); d-- > 0;) {
      if (++index[d] < t.shape[d]) break;
      index[d] = 0;
    }
  }
  return out;
}

std::vector<float> TorchFile::f32(const pickle::TensorRef& t, const std::string& what) const {
  const std::string& type = t.storage.type;
  if (type != "FloatStorage" && type != "HalfStorage" && type != "BFloat16Storage" && type != "DoubleStorage")
    throw runtime_error(path() + ": tensor " + what + " holds " + type + ", not floating-point values");
  return convert<float>(t, what);
}

std::vector<int64_t> TorchFile::i64(const pickle::TensorRef& t, const std::string& what) const {
  return convert<int64_t>(t, what);
}

void write_torch_file(const zip::StoredWriter::Append& append, const std::string& archive, const pickle::Value& root,
                      const std::vector<TorchStorageSource>& storages) {
  static const std::string kVersion = "3\n";
  zip::StoredWriter writer(append);
  writer.add(archive + "/data.pkl", pickle::dump(root));
  for (const TorchStorageSource& s : storages) writer.add(archive + "/data/" + s.key, s.bytes());
  writer.add(archive + "/version", {reinterpret_cast<const uint8_t*>(kVersion.data()), kVersion.size()});
  writer.finish();
}

std::vector<uint8_t> torch_file_bytes(const std::string& archive, const pickle::Value& root,
                                      const std::vector<TorchStorageBytes>& storages) {
  std::vector<TorchStorageSource> sources;
  for (const TorchStorageBytes& s : storages) sources.push_back({s.key, [&s] { return s.bytes; }});
  std::vector<uint8_t> out;
  write_torch_file([&out](std::span<const uint8_t> b) { out.insert(out.end(), b.begin(), b.end()); }, archive, root,
                   sources);
  return out;
}

}  // namespace tessera
