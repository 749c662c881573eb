#include "tessera/ckpt/megatron_distrib_optim.h"

#include "tessera/core/error.h"
#include "tessera/core/file_io.h"

namespace tessera {
namespace {

using pickle::Kind;
using pickle::Value;

const char* torch_dtype(DType t) {
  switch (t) {
    case DType::BF16: return "torch.bfloat16";
    case DType::F16: return "torch.float16";
    default: return "torch.float32";
  }
}

Error file_error(const std::string& path, const std::string& what) {
  return runtime_error(path + ": " + what + ", not Megatron's distrib_optim.pt (buckets coalesced, core_r0.10.0)",
                       "pass --no-load-optim to load the model alone");
}

// The one value of a dict of one entry (the dtype pair's).
const Value* only_entry(const Value* dict, const std::string& path, const std::string& what) {
  if (!dict || dict->kind != Kind::Dict || dict->entries.size() != 1)
    throw file_error(path, what + " is " + (dict ? pickle::describe(*dict) : "missing") + ", not a dict of one dtype");
  return dict->entries.front().second;
}

}  // namespace

DistribOptimPlacement distrib_optim_placement(const GradBufferLayout& layout, const std::vector<int>& chunks) {
  TESSERA_CHECK(chunks.size() == layout.params.size(), "distrib_optim: one chunk per parameter");
  DistribOptimPlacement p;
  std::vector<int64_t> bucket_offset(layout.buckets.size());
  for (size_t b = 0; b < layout.buckets.size(); ++b) {
    const size_t c = static_cast<size_t>(chunks.at(layout.buckets[b].first_param));
    if (c >= p.numel_unpadded.size()) p.numel_unpadded.resize(c + 1, 0);
    bucket_offset[b] = p.numel_unpadded[c];
    p.numel_unpadded[c] += layout.buckets[b].numel_unpadded;
  }
  for (size_t i = 0; i < layout.params.size(); ++i) {
    const GradBufferLayout::Param& param = layout.params[i];
    p.buffer.push_back(chunks[i]);
    p.offset.push_back(bucket_offset[param.bucket] + param.start - layout.buckets[param.bucket].start);
  }
  return p;
}

namespace {

// One optimizer's dict, its storages appended to `storages`.
Value* distrib_optim_dict(pickle::Document& doc, std::vector<TorchStorageSource>& storages,
                          const DistribOptimState& state) {
  const GradBufferLayout& layout = *state.layout;
  const DistribOptimPlacement place = distrib_optim_placement(layout, state.chunks);
  // Buffer c's tensor of kind k: its parameters at their offsets, the alignment gaps zero.
  auto tensor = [&](size_t c, size_t k) {
    const int64_t n = place.numel_unpadded[c];
    storages.push_back({std::to_string(storages.size()), [&layout, &state, place, c, k, n] {
      // Filled in place (operator new's alignment suits float): one copy of the tensor in memory.
      std::vector<uint8_t> bytes(static_cast<size_t>(n) * sizeof(float), 0);
      float* values = reinterpret_cast<float*>(bytes.data());
      for (size_t p = 0; p < layout.params.size(); ++p)
        if (static_cast<size_t>(place.buffer[p]) == c) state.fill(p, k, values + place.offset[p]);
      return bytes;
    }});
    return doc.tensor({{storages.back().key, "FloatStorage", "cpu", n}, 0, {n}, {1}});
  };
  Value* root = doc.dict();
  doc.set(root, "buckets_coalesced", doc.boolean(true));
  for (size_t c = 0; c < place.numel_unpadded.size(); ++c) {
    Value* tensors = doc.dict();
    for (size_t k = 0; k < std::size(kDistribOptimKeys); ++k) doc.set(tensors, kDistribOptimKeys[k], tensor(c, k));
    doc.set(tensors, "numel_unpadded", doc.integer(place.numel_unpadded[c]));
    Value* by_dtype = doc.dict();
    doc.set(by_dtype, doc.tuple({doc.global(torch_dtype(state.param_dtype)), doc.global(torch_dtype(state.grad_dtype))}),
            tensors);
    doc.set(root, doc.integer(static_cast<int64_t>(c)), by_dtype);
  }
  return root;
}

// One optimizer's dict of the file (`what` names it in errors).
DistribOptimBuffers read_distrib_optim_dict(const TorchFile& file, const Value& root, const std::string& what) {
  const std::string& path = file.path();
  DistribOptimBuffers out;
  const Value* coalesced = root.get("buckets_coalesced");
  if (root.kind != Kind::Dict || !coalesced || coalesced->kind != Kind::Bool || !coalesced->boolean)
    throw file_error(path, what + " has no buckets_coalesced: True");
  for (int64_t c = 0;; ++c) {
    const Value* by_dtype = nullptr;
    for (const auto& [key, v] : root.entries)
      if (key->kind == Kind::Int && key->integer == c) by_dtype = v;
    if (!by_dtype) break;
    const std::string where = what + "'s buffer " + std::to_string(c);
    const Value* tensors = only_entry(by_dtype, path, where);
    const Value* numel = tensors->kind == Kind::Dict ? tensors->get("numel_unpadded") : nullptr;
    if (!numel || numel->kind != Kind::Int || numel->integer < 0)
      throw file_error(path, where + " has no numel_unpadded");
    auto& buffer = out.buffers.emplace_back();
    for (const char* key : kDistribOptimKeys) {
      const Value* t = tensors->get(key);
      if (!t || t->kind != Kind::Tensor || t->tensor.shape != std::vector<int64_t>{numel->integer} ||
          t->tensor.storage.type != "FloatStorage")
        throw file_error(path, where + "'s " + key + " is " + (t ? pickle::describe(*t) : "missing") +
                                   ", not a flat fp32 tensor of its numel_unpadded " + std::to_string(numel->integer));
      file.check(t->tensor, where + "." + key);
      buffer[key] = &t->tensor;
    }
    out.numel_unpadded.push_back(numel->integer);
  }
  if (out.buffers.empty()) throw file_error(path, what + " holds no buffer 0");
  return out;
}

}  // namespace

void write_distrib_optim_file(const std::string& path, const std::vector<const DistribOptimState*>& optimizers) {
  TESSERA_CHECK(!optimizers.empty() && (optimizers.size() > 1 || optimizers[0]), "distrib_optim: an optimizer to write");
  pickle::Document doc;
  std::vector<TorchStorageSource> storages;
  Value* root = nullptr;
  if (optimizers.size() == 1) {
    root = distrib_optim_dict(doc, storages, *optimizers[0]);
  } else {
    root = doc.list();
    for (const DistribOptimState* o : optimizers)
      root->items.push_back(o ? distrib_optim_dict(doc, storages, *o) : doc.none());
  }
  doc.root = root;
  SyncedFileWriter file(path);
  write_torch_file([&file](std::span<const uint8_t> b) { file.append({reinterpret_cast<const char*>(b.data()), b.size()}); },
                   "distrib_optim", *root, storages);
  file.finish();
}

DistribOptimFile open_distrib_optim(const std::string& path) {
  DistribOptimFile f{TorchFile::open(path), {}};
  const Value& root = f.file.root();
  if (root.kind != Kind::List) {
    f.optimizers.emplace_back(read_distrib_optim_dict(f.file, root, "its root"));
    return f;
  }
  for (size_t i = 0; i < root.items.size(); ++i) {
    if (root.items[i]->kind == Kind::None)
      f.optimizers.emplace_back();
    else
      f.optimizers.emplace_back(read_distrib_optim_dict(f.file, *root.items[i], "chained optimizer " + std::to_string(i)));
  }
  if (f.optimizers.empty()) throw file_error(path, "its root is an empty list");
  return f;
}

}  // namespace tessera
