#include "tessera/ckpt/dcp_metadata.h"

#include <algorithm>
#include <filesystem>
#include <map>

#include "tessera/ckpt/pickle.h"
#include "tessera/core/error.h"
#include "tessera/core/mapped_file.h"

namespace tessera {
namespace {

namespace fs = std::filesystem;
using pickle::Kind;
using pickle::Value;

constexpr const char* kMetadataFile = ".metadata";
constexpr size_t kMaxDims = 16;

// ---- .metadata ------------------------------------------------------------------------------

[[noreturn]] void bad_metadata(const std::string& label, const std::string& what) {
  throw runtime_error(label + ": " + what,
                      "the file is not the .metadata of a torch_dist checkpoint, or it is damaged; copy the "
                      "iteration folder again from its source");
}

const Value* field(const Value* obj, std::string_view name, Kind kind, const std::string& label) {
  const Value* v = obj ? obj->get(name) : nullptr;
  if (!v || v->kind != kind)
    bad_metadata(label, "field '" + std::string(name) + "' is " + (v ? pickle::describe(*v) : "missing") + " in " +
                            (obj ? pickle::describe(*obj) : "nothing"));
  return v;
}

bool is_record(const Value* v, std::string_view cls) {
  return v && v->kind == Kind::Object && v->text == "torch.distributed.checkpoint.metadata." + std::string(cls);
}

std::vector<int64_t> int_list(const Value* v, const std::string& label, const char* what) {
  if (!v || (v->kind != Kind::Tuple && v->kind != Kind::List))
    bad_metadata(label, std::string(what) + " is " + (v ? pickle::describe(*v) : "missing") + ", not a tuple");
  if (v->items.size() > kMaxDims) bad_metadata(label, std::string(what) + " has more than 16 dimensions");
  std::vector<int64_t> out;
  for (const Value* x : v->items) {
    if (x->kind != Kind::Int || x->integer < 0 || x->integer > (int64_t{1} << 40))
      bad_metadata(label, std::string(what) + " holds " + pickle::describe(*x));
    out.push_back(x->integer);
  }
  return out;
}

// A chunk file's name: a plain name in the iteration folder, never a path out of it.
bool safe_file_name(const std::string& name) {
  return !name.empty() && name.size() < 256 && name.find('/') == std::string::npos &&
         name.find('\\') == std::string::npos && name != "." && name != ".." && name.find('\0') == std::string::npos;
}

std::string tensor_dtype(const Value* meta, const std::string& label, const std::string& key) {
  const Value* props = meta->get("properties");
  if (!is_record(props, "TensorProperties") || !props->state || props->state->kind != Kind::Tuple ||
      props->state->items.empty() || props->state->items[0]->kind != Kind::Global)
    bad_metadata(label, key + "'s properties are " + (props ? pickle::describe(*props) : "missing"));
  return props->state->items[0]->text;
}

using ChunkKey = std::pair<std::string, std::vector<int64_t>>;  // (key, chunk offsets)

// storage_data: MetadataIndex(fqn, offset, index) -> _StorageInfo(relative_path, offset, length).
std::map<ChunkKey, DcpChunk> storage_of(const Value* root, const std::string& label) {
  std::map<ChunkKey, DcpChunk> out;
  for (const auto& [k, v] : field(root, "storage_data", Kind::Dict, label)->entries) {
    if (!is_record(k, "MetadataIndex") || v->kind != Kind::Object ||
        v->text != "torch.distributed.checkpoint.filesystem._StorageInfo")
      bad_metadata(label, "storage_data maps " + pickle::describe(*k) + " to " + pickle::describe(*v));
    const std::string fqn = field(k, "fqn", Kind::Str, label)->text;
    const Value* offset = k->get("offset");
    std::vector<int64_t> offsets;
    if (offset && offset->kind != Kind::None) offsets = int_list(offset, label, "a MetadataIndex offset");
    DcpChunk c;
    c.file = field(v, "relative_path", Kind::Str, label)->text;
    const int64_t at = field(v, "offset", Kind::Int, label)->integer;
    const int64_t length = field(v, "length", Kind::Int, label)->integer;
    if (!safe_file_name(c.file)) bad_metadata(label, fqn + " is stored in '" + c.file + "', not a file of the folder");
    if (at < 0 || length <= 0) bad_metadata(label, fqn + " is stored at offset " + std::to_string(at) + " length " +
                                                       std::to_string(length));
    c.offset = static_cast<uint64_t>(at);
    c.length = static_cast<uint64_t>(length);
    if (!out.emplace(ChunkKey{fqn, offsets}, c).second) bad_metadata(label, fqn + " has two storage records");
  }
  return out;
}

// mcore_data: key -> {'nd_reformulated_orig_global_shape': (dims)} for reformulated tensors
// (other keys' dicts are empty); absent in files megatron-core did not write.
std::map<std::string, std::vector<int64_t>> reformulated_shapes(const Value* root, const std::string& label) {
  std::map<std::string, std::vector<int64_t>> out;
  const Value* mcore = root->get("mcore_data");
  if (!mcore || mcore->kind == Kind::None) return out;
  if (mcore->kind != Kind::Dict) bad_metadata(label, "mcore_data is " + pickle::describe(*mcore));
  for (const auto& [k, v] : mcore->entries) {
    if (k->kind != Kind::Str || v->kind != Kind::Dict)
      bad_metadata(label, "mcore_data maps " + pickle::describe(*k) + " to " + pickle::describe(*v));
    if (const Value* shape = v->get("nd_reformulated_orig_global_shape"))
      out[k->text] = int_list(shape, label, "an nd_reformulated_orig_global_shape");
  }
  return out;
}

std::string dims_text(const std::vector<int64_t>& dims) {
  std::string s = "[";
  for (size_t i = 0; i < dims.size(); ++i) s += (i ? ", " : "") + std::to_string(dims[i]);
  return s + "]";
}

int64_t checked_numel(const std::vector<int64_t>& dims, const std::string& label, const std::string& key) {
  int64_t n = 1;
  for (int64_t d : dims) {
    if (d != 0 && n > (int64_t{1} << 40) / d) bad_metadata(label, key + " has more than 2^40 elements");
    n *= d;
  }
  return n;
}

// A reformulated tensor back in its original shape: its chunks grouped by block, each block's
// ranges sorted and checked to cover it exactly once.
void restore_reformulated(DcpTensor& t, const std::vector<int64_t>& orig, const std::string& label) {
  const size_t n = orig.size();
  if (t.size.size() != n + 1)
    bad_metadata(label, t.key + " is saved as " + std::to_string(t.size.size()) + " dimensions, reformulated from " +
                            std::to_string(n) + "; it needs one more");
  std::vector<int64_t> block(n);
  for (size_t d = 0; d < n; ++d) {
    if (t.size[d] == 0 || orig[d] % t.size[d] != 0)
      bad_metadata(label, t.key + "'s original dimension " + std::to_string(d) + " (" + std::to_string(orig[d]) +
                              ") is not a multiple of its " + std::to_string(t.size[d]) + " blocks");
    block[d] = orig[d] / t.size[d];
  }
  const int64_t block_numel = checked_numel(block, label, t.key);
  if (block_numel != t.size[n])
    bad_metadata(label, t.key + "'s blocks hold " + std::to_string(block_numel) + " elements, its flat axis " +
                            std::to_string(t.size[n]));
  std::map<std::vector<int64_t>, std::vector<DcpChunk>> blocks;
  for (DcpChunk& c : t.chunks) {
    for (size_t d = 0; d < n; ++d)
      if (c.sizes[d] != 1) bad_metadata(label, t.key + " has a chunk over more than one block");
    blocks[{c.offsets.begin(), c.offsets.begin() + static_cast<std::ptrdiff_t>(n)}].push_back(std::move(c));
  }
  t.chunks.clear();
  for (auto& [coords, parts] : blocks) {
    std::sort(parts.begin(), parts.end(),
              [n](const DcpChunk& a, const DcpChunk& b) { return a.offsets[n] < b.offsets[n]; });
    int64_t covered = 0;
    for (const DcpChunk& p : parts) {
      if (p.offsets[n] != covered)
        bad_metadata(label, t.key + "'s block " + dims_text(coords) + " has a gap or an overlap at flat element " +
                                std::to_string(covered));
      covered += p.sizes[n];
    }
    if (covered != block_numel)
      bad_metadata(label, t.key + "'s block ranges end at " + std::to_string(covered) + " of " +
                              std::to_string(block_numel) + " elements");
    DcpChunk whole;
    for (size_t d = 0; d < n; ++d) whole.offsets.push_back(coords[d] * block[d]);
    whole.sizes = block;
    whole.parts = std::move(parts);
    t.chunks.push_back(std::move(whole));
  }
  t.size = orig;
}

}  // namespace

DcpMetadata parse_dcp_metadata(std::span<const uint8_t> bytes, const std::string& label) {
  const pickle::Document doc = pickle::unpickle(bytes, label, pickle::Dialect::DcpMetadata);
  const Value* root = doc.root;
  if (!is_record(root, "Metadata"))
    bad_metadata(label, "the pickle holds " + pickle::describe(*root) + ", not a Metadata");
  std::map<ChunkKey, DcpChunk> storage = storage_of(root, label);
  const std::map<std::string, std::vector<int64_t>> reformulated = reformulated_shapes(root, label);
  DcpMetadata out;
  for (const auto& [k, v] : field(root, "state_dict_metadata", Kind::Dict, label)->entries) {
    if (k->kind != Kind::Str) bad_metadata(label, "a state_dict_metadata key is " + pickle::describe(*k));
    if (is_record(v, "BytesStorageMetadata")) {
      auto s = storage.find({k->text, {}});
      if (s == storage.end()) bad_metadata(label, k->text + " has no storage record");
      out.byte_objects.push_back({k->text, s->second});
      continue;
    }
    if (!is_record(v, "TensorStorageMetadata")) bad_metadata(label, k->text + " is " + pickle::describe(*v));
    DcpTensor t;
    t.key = k->text;
    t.dtype = tensor_dtype(v, label, t.key);
    t.size = int_list(v->get("size"), label, "a tensor size");
    for (const Value* c : field(v, "chunks", Kind::List, label)->items) {
      if (!is_record(c, "ChunkStorageMetadata")) bad_metadata(label, t.key + " has the chunk " + pickle::describe(*c));
      std::vector<int64_t> offsets = int_list(c->get("offsets"), label, "chunk offsets");
      std::vector<int64_t> sizes = int_list(c->get("sizes"), label, "chunk sizes");
      if (offsets.size() != t.size.size() || sizes.size() != t.size.size())
        bad_metadata(label, t.key + " has a chunk of another rank than its size");
      for (size_t d = 0; d < sizes.size(); ++d)
        if (sizes[d] == 0 || offsets[d] + sizes[d] > t.size[d])
          bad_metadata(label, t.key + " has a chunk outside its size along dimension " + std::to_string(d));
      auto s = storage.find({t.key, offsets});
      if (s == storage.end()) bad_metadata(label, t.key + " has a chunk without a storage record");
      DcpChunk chunk = s->second;
      chunk.offsets = std::move(offsets);
      chunk.sizes = std::move(sizes);
      t.chunks.push_back(std::move(chunk));
    }
    if (auto r = reformulated.find(t.key); r != reformulated.end()) restore_reformulated(t, r->second, label);
    out.tensors.push_back(std::move(t));
  }
  return out;
}

DcpMetadata read_dcp_metadata(const std::string& it_dir) {
  const std::string path = (fs::path(it_dir) / kMetadataFile).string();
  const MappedFile map(path);
  return parse_dcp_metadata(map.bytes(), path);
}


}  // namespace tessera
