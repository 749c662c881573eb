#include "tessera/ckpt/torch_dist.h"

#include <algorithm>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <map>
#include <memory>
#include <optional>

#include <nlohmann/json.hpp>

#include "tessera/ckpt/megatron_checkpoint.h"
#include "tessera/ckpt/megatron_layer_spec.h"
#include "tessera/ckpt/megatron_values.h"
#include "tessera/ckpt/pickle.h"
#include "tessera/ckpt/torch_file.h"
#include "tessera/core/error.h"
#include "tessera/core/file_io.h"
#include "tessera/core/mapped_file.h"

namespace tessera {
namespace {

namespace fs = std::filesystem;
using json = nlohmann::json;
using pickle::Kind;
using pickle::Value;

constexpr const char* kCommonFile = "common.pt";
constexpr const char* kMetadataName = ".metadata";
constexpr const char* kOptimizerPrefix = "optimizer.state.";


// ---- Chunks ---------------------------------------------------------------------------------

// The .distcp files, mapped once each, read one chunk at a time.
class ChunkReader {
 public:
  explicit ChunkReader(std::string it_dir) : it_dir_(std::move(it_dir)) {}

  // The chunk's elements (a reformulated block's: its ranges' in order), each payload (a
  // torch.save of one tensor) checked against what .metadata says.
  std::vector<float> read(const DcpTensor& t, const DcpChunk& c) {
    if (c.parts.empty()) return read_payload(t, c);
    std::vector<float> values;
    for (const DcpChunk& part : c.parts) {
      const std::vector<float> v = read_payload(t, part);
      values.insert(values.end(), v.begin(), v.end());
    }
    return values;
  }

  static std::string storage_type(const std::string& dtype) {
    static const std::map<std::string, std::string> kTypes = {
        {"torch.float32", "FloatStorage"}, {"torch.float16", "HalfStorage"}, {"torch.bfloat16", "BFloat16Storage"},
        {"torch.float64", "DoubleStorage"}, {"torch.int64", "LongStorage"}, {"torch.int32", "IntStorage"}};
    auto it = kTypes.find(dtype);
    return it == kTypes.end() ? dtype : it->second;
  }

  // A byte object's payload (a torch.save of a ShardedObject's value) and its label.
  std::pair<std::vector<uint8_t>, std::string> object_bytes(const DcpObject& o) {
    const auto& map = file(o.where.file);
    check_extent(*map, o.key, o.where);
    const auto bytes = map->bytes().subspan(o.where.offset, o.where.length);
    return {{bytes.begin(), bytes.end()}, map->path() + " @" + std::to_string(o.where.offset) + " (" + o.key + ")"};
  }

 private:
  static void check_extent(const MappedFile& map, const std::string& key, const DcpChunk& c) {
    if (c.offset > map.size() || c.length > map.size() - c.offset)
      throw runtime_error(map.path() + ": " + key + "'s chunk at bytes [" + std::to_string(c.offset) + ", " +
                              std::to_string(c.offset + c.length) + ") lies past the end of the file (" +
                              std::to_string(map.size()) + " bytes)",
                          "the file is truncated; copy the iteration folder again from its source");
  }

  std::vector<float> read_payload(const DcpTensor& t, const DcpChunk& c) {
    const auto& map = file(c.file);
    check_extent(*map, t.key, c);
    const std::string label = map->path() + " @" + std::to_string(c.offset);
    const TorchFile payload = TorchFile::from_view(label, map->bytes().subspan(c.offset, c.length), map);
    const Value& root = payload.root();
    if (root.kind != Kind::Tensor)
      throw runtime_error(label + ": " + t.key + "'s chunk holds " + pickle::describe(root) + ", not a tensor");
    if (root.tensor.shape != c.sizes || storage_type(t.dtype) != root.tensor.storage.type)
      throw runtime_error(label + ": " + t.key + "'s chunk is " + root.tensor.storage.type + " " +
                              shape_str(Shape(root.tensor.shape.begin(), root.tensor.shape.end())) +
                              ", .metadata says " + t.dtype + " " + shape_str(Shape(c.sizes.begin(), c.sizes.end())),
                          "the checkpoint's files come from different saves; copy the iteration folder again");
    std::vector<float> values = payload.f32(root.tensor, t.key);
    map->drop_pages(c.offset, c.length);
    return values;
  }

  const std::shared_ptr<MappedFile>& file(const std::string& name) {
    auto it = files_.find(name);
    if (it == files_.end())
      it = files_.emplace(name, std::make_shared<MappedFile>((fs::path(it_dir_) / name).string())).first;
    return it->second;
  }

  std::string it_dir_;
  std::map<std::string, std::shared_ptr<MappedFile>> files_;
};

// ---- Keys -> tessera's pieces -----------------------------------------------------------------

// One piece of a tessera tensor: chunk `chunk` of `tensor` (entry `slot` of its leading axes,
// the layer and/or expert of a stacked one), and for SwiGLU's fc1 the matching V chunk
// `second`, its rows after the W chunk's.
struct ChunkPiece {
  const DcpTensor* tensor = nullptr;
  size_t chunk = 0;
  std::optional<size_t> second;
  int64_t slot = -1;   // index into the chunk's leading axes, flattened; -1: none
  size_t leading = 0;  // how many leading axes (layer, expert) the chunk has
};

struct Pieces {
  std::vector<ExternalPiece> pieces;
  std::vector<ChunkPiece> chunks;
};

// "decoder.layers.self_attention.linear_qkv.weight": the layer axis leads (no layer number).
// megatron-core numbers the layers in the key instead when they differ (transformer_block.py
// sharded_state_dict: non_homogeneous_layers, which --moe-layer-freq other than 1 implies).
bool is_stacked(const std::string& key) {
  const std::string root = "decoder.layers.";
  return key.starts_with(root) && key.size() > root.size() && (key[root.size()] < '0' || key[root.size()] > '9');
}

// SequentialMLP's experts (megatron/core/transformer/moe/experts.py sharded_state_dict): one key
// for every expert of a layer, the expert axis after the layer axis.
constexpr std::string_view kExpertsKey = "mlp.experts.experts.";
constexpr std::string_view kExpertsName = "mlp.experts.local_experts.";

bool has_expert_axis(const std::string& key) { return key.find(kExpertsKey) != std::string::npos; }

// The tessera name of a parameter key (layer `layer` of a stacked one, expert `expert` of an
// experts' key); nullopt for what holds no parameter.
std::optional<std::string> tessera_name(std::string key, int64_t layer, int64_t expert) {
  if (expert >= 0) {
    const size_t at = key.find(kExpertsKey);
    key = key.substr(0, at) + std::string(kExpertsName) + std::to_string(expert) + "." +
          key.substr(at + kExpertsKey.size());
  }
  if (layer < 0) {
    const auto m = map_megatron_name(key);
    if (!m) return std::nullopt;
    return m->first < 0 ? m->second : "decoder.layers." + std::to_string(m->first) + "." + m->second;
  }
  const std::string rest = key.substr(std::string("decoder.layers.").size());
  const auto m = map_megatron_name("decoder.layers.0." + rest);
  if (!m) return std::nullopt;
  return "decoder.layers." + std::to_string(layer) + "." + m->second;
}

// Every MLP's fc1: the dense one's, each expert's, the shared experts'.
bool is_gated_fc1(const std::string& name) {
  return name.ends_with(".linear_fc1.weight") || name.ends_with(".linear_fc1.bias");
}

// The one dimension a chunk is cut along (-1: whole); an Error when it is cut along more.
int chunk_split_dim(const DcpTensor& t, const DcpChunk& c, size_t first_dim) {
  int dim = -1;
  for (size_t d = first_dim; d < t.size.size(); ++d)
    if (c.sizes[d] != t.size[d]) {
      if (dim >= 0)
        throw runtime_error("torch_dist tensor " + t.key + " has a chunk cut along dimensions " + std::to_string(dim) +
                                " and " + std::to_string(d) + ", which tessera does not reshard",
                            "save it with the plain optimizer, or load with --no-load-optim");
      dim = static_cast<int>(d - first_dim);
    }
  return dim;
}

void add_piece(Pieces& out, const std::string& name, const DcpTensor& t, size_t chunk, int64_t slot, size_t first,
               bool gated, const std::map<std::vector<int64_t>, size_t>& by_offsets, size_t source) {
  const DcpChunk& c = t.chunks[chunk];
  Shape global(t.size.begin() + static_cast<std::ptrdiff_t>(first), t.size.end());
  Shape shape(c.sizes.begin() + static_cast<std::ptrdiff_t>(first), c.sizes.end());
  int split = chunk_split_dim(t, c, first);
  int64_t offset = split >= 0 ? c.offsets[first + static_cast<size_t>(split)] : 0;
  ChunkPiece piece{&t, chunk, std::nullopt, first > 0 ? slot : -1, first};
  if (gated) {
    // [W rows of every TP rank; V rows of every TP rank] -> tessera's [2, F, ...]: a W chunk
    // pairs with the V chunk F rows further on; a chunk of all 2F rows is both.
    if (global.empty() || global[0] % 2 != 0 || split > 0)
      throw runtime_error("torch_dist tensor " + t.key + " " + shape_str(global) + " is not a SwiGLU fc1",
                          "check the checkpoint's --swiglu");
    const int64_t f = global[0] / 2, rows = shape[0];
    global[0] = f;
    global.insert(global.begin(), 2);
    shape[0] = split < 0 ? f : rows;
    shape.insert(shape.begin(), 2);
    if (split == 0) {
      if (offset >= f) return;  // a V chunk: read with its W chunk
      if (offset + rows > f)
        throw runtime_error("torch_dist tensor " + t.key + " has a chunk across its W and V halves (rows " +
                            std::to_string(offset) + "..." + std::to_string(offset + rows) + " of 2 x " +
                            std::to_string(f) + ")");
      std::vector<int64_t> v_offsets = c.offsets;
      v_offsets[first] += f;
      auto v = by_offsets.find(v_offsets);
      if (v == by_offsets.end() || t.chunks[v->second].sizes != c.sizes)
        throw runtime_error("torch_dist tensor " + t.key + " lacks the V chunk of its W chunk at row " +
                            std::to_string(offset));
      piece.second = v->second;
      split = rows == f ? -1 : 1;
      if (rows == f) offset = 0;
    }
  }
  ExternalPiece p{name, shape, TensorPlacement{global, split, offset}, source};
  out.pieces.push_back(std::move(p));
  out.chunks.push_back(piece);
}

// Every chunk of `keys` as pieces of tessera's tensors; `prefix` is put before each tessera name
// ("exp_avg." for optimizer state).
void add_tensor_pieces(Pieces& out, const DcpTensor& t, const std::string& param_key, const std::string& prefix,
                       bool swiglu, std::map<std::string, size_t>& sources) {
  const bool stacked = is_stacked(param_key), experts = has_expert_axis(param_key);
  const size_t leading = (stacked ? 1 : 0) + (experts ? 1 : 0);
  if (t.size.size() < leading)
    throw runtime_error("torch_dist tensor " + t.key + " lacks its layer or expert axis");
  std::map<std::vector<int64_t>, size_t> by_offsets;
  for (size_t i = 0; i < t.chunks.size(); ++i) by_offsets[t.chunks[i].offsets] = i;
  for (size_t i = 0; i < t.chunks.size(); ++i) {
    const DcpChunk& c = t.chunks[i];
    const size_t source = sources.emplace(c.file, sources.size()).first->second;
    // The chunk's layers and experts: its leading axes' ranges (one entry when absent).
    const int64_t l0 = stacked ? c.offsets[0] : -1, nl = stacked ? c.sizes[0] : 1;
    const int64_t e0 = experts ? c.offsets[leading - 1] : -1, ne = experts ? c.sizes[leading - 1] : 1;
    for (int64_t l = 0; l < nl; ++l)
      for (int64_t e = 0; e < ne; ++e) {
        const std::optional<std::string> name =
            tessera_name(param_key, stacked ? l0 + l : -1, experts ? e0 + e : -1);
        if (!name) continue;
        add_piece(out, prefix + *name, t, i, l * ne + e, leading, swiglu && is_gated_fc1(*name), by_offsets, source);
      }
  }
}

// Chunk `c`'s elements for entry `slot` of its `leading` axes (flattened), or all of them.
std::vector<float> slot_of(std::vector<float> values, const DcpChunk& c, int64_t slot, size_t leading) {
  int64_t entries = 1;
  for (size_t d = 0; d < leading; ++d) entries *= c.sizes[d];
  if (slot < 0 || entries == 1) return values;
  const size_t per = values.size() / static_cast<size_t>(entries);
  return {values.begin() + static_cast<std::ptrdiff_t>(per * slot),
          values.begin() + static_cast<std::ptrdiff_t>(per * (slot + 1))};
}

std::vector<float> read_piece(ChunkReader& reader, const ChunkPiece& p) {
  const DcpChunk& c = p.tensor->chunks[p.chunk];
  std::vector<float> values = slot_of(reader.read(*p.tensor, c), c, p.slot, p.leading);
  if (p.second) {
    const DcpChunk& v = p.tensor->chunks[*p.second];
    std::vector<float> second = slot_of(reader.read(*p.tensor, v), v, p.slot, p.leading);
    values.insert(values.end(), second.begin(), second.end());
  }
  return values;
}

json read_json(const fs::path& path) {
  std::ifstream in(path);
  if (!in) throw runtime_error("cannot read " + path.string());
  try {
    return json::parse(in);
  } catch (const json::exception& e) {
    throw runtime_error(path.string() + " is not valid JSON: " + e.what());
  }
}

}  // namespace

bool is_torch_dist_checkpoint(const std::string& dir, int64_t iteration) {
  const fs::path meta = fs::path(checkpoint_iteration_dir(dir, iteration)) / "metadata.json";
  if (!fs::exists(meta)) return false;
  const json j = read_json(meta);
  if (!j.is_object() || !j.contains("sharded_backend")) return false;
  const json& backend = j.at("sharded_backend");
  if (backend != "torch_dist")
    throw runtime_error(meta.string() + " names the sharded backend " + backend.dump() +
                            "; tessera reads torch_dist (Megatron's default) and torch",
                        "convert it with Megatron-LM (--ckpt-convert-format torch_dist) first");
  return true;
}

CheckpointState read_torch_dist_metadata(const std::string& dir, int64_t iteration) {
  const std::string it_dir = checkpoint_iteration_dir(dir, iteration);
  const TorchFile common = TorchFile::open((fs::path(it_dir) / kCommonFile).string());
  CheckpointState s = megatron_training_state(common);
  if (iteration == kReleaseIteration) {
    s.release = true;
    s.iteration = 0;
  }
  return s;
}

CheckpointState load_torch_dist_checkpoint(const std::string& dir, int64_t iteration,
                                           const std::vector<FlatPiece>& model,
                                           const std::vector<FlatPiece>& optimizer, bool load_optimizer,
                                           int /*tp_rank*/, int /*tp_size*/) {
  const std::string it_dir = checkpoint_iteration_dir(dir, iteration);
  CheckpointState s = read_torch_dist_metadata(dir, iteration);
  load_optimizer = load_optimizer && !s.release;
  check_megatron_iteration(it_dir, s, iteration);
  const DcpMetadata meta = read_dcp_metadata(it_dir);
  const bool swiglu = s.args.value("swiglu", false);
  Pieces model_pieces, optimizer_pieces, main_pieces;
  std::map<std::string, size_t> sources;
  bool has_optimizer = false;
  for (const DcpTensor& t : meta.tensors) {
    if (!t.key.starts_with(kOptimizerPrefix)) {
      if (!t.key.starts_with("optimizer.")) add_tensor_pieces(model_pieces, t, t.key, "", swiglu, sources);
      else has_optimizer = true;  // the distributed optimizer's deprecated fully_sharded_bucket_space
      continue;
    }
    const std::string rest = t.key.substr(std::strlen(kOptimizerPrefix));
    const size_t dot = rest.find('.');
    const std::string kind = rest.substr(0, dot), param = dot == std::string::npos ? "" : rest.substr(dot + 1);
    has_optimizer = true;
    if (kind == "exp_avg" || kind == "exp_avg_sq")
      add_tensor_pieces(optimizer_pieces, t, param, kind + ".", swiglu, sources);
    else if (kind == "fp32_param")
      add_tensor_pieces(main_pieces, t, param, "", swiglu, sources);
  }
  // A 16-bit run's fp32 main parameters are the values to load, as for Megatron's own files.
  if (load_optimizer && !main_pieces.pieces.empty()) model_pieces = std::move(main_pieces);
  // dp_zero_gather_scatter (Megatron's --no-ckpt-fully-parallel-save with the distributed
  // optimizer) keeps each (tp, pp) rank's state as one byte object gathered on DP rank 0.
  const bool dp_zero = std::any_of(meta.byte_objects.begin(), meta.byte_objects.end(), [](const DcpObject& o) {
    return o.key.starts_with("optimizer.distributed.");
  });
  if (load_optimizer && !has_optimizer && !dp_zero)
    throw runtime_error("checkpoint " + it_dir + " holds no optimizer state",
                        "load it with --no-load-optim (or --finetune), as Megatron-LM would");
  if (load_optimizer && optimizer_pieces.pieces.empty())
    throw runtime_error("checkpoint " + it_dir + " holds the distributed optimizer's state in the " +
                            (dp_zero ? "dp_zero_gather_scatter" : "fully_sharded_bucket_space") +
                            " layout, which tessera does not read (nor does Megatron-LM at another TP/PP)",
                        "load it with --no-load-optim, or save it from Megatron-LM with its default "
                        "--ckpt-fully-parallel-save (the fully_sharded_model_space layout)");
  std::vector<ExternalSource> source_list(sources.size());
  for (const auto& [name, index] : sources) source_list[index] = {(fs::path(it_dir) / name).string(), -1};
  ChunkReader reader(it_dir);
  auto read = [&reader](const Pieces& p) {
    return [&reader, &p](size_t i) { return read_piece(reader, p.chunks[i]); };
  };
  load_external_pieces(it_dir, source_list, model_pieces.pieces, model, -1, "parameter", read(model_pieces));
  if (load_optimizer)
    load_external_pieces(it_dir, source_list, optimizer_pieces.pieces, optimizer, -1, "optimizer state",
                         read(optimizer_pieces));
  return s;
}

std::optional<std::vector<uint8_t>> read_torch_dist_rng_state(const std::string& dir, int64_t iteration,
                                                              const TorchDistRank& rank) {
  const std::string it_dir = checkpoint_iteration_dir(dir, iteration);
  const std::string key = torch_dist_rank_object_key("rng_state", rank);
  const DcpMetadata meta = read_dcp_metadata(it_dir);
  const auto o = std::find_if(meta.byte_objects.begin(), meta.byte_objects.end(),
                              [&key](const DcpObject& x) { return x.key == key; });
  if (o == meta.byte_objects.end()) return std::nullopt;
  ChunkReader reader(it_dir);
  auto [bytes, label] = reader.object_bytes(*o);
  // The ShardedObject's data in a list (megatron/core/dist_checkpointing/strategies/torch.py):
  // get_rng_state's list of dicts, whose keys megatron/training/checkpointing.py load_checkpoint
  // reads.
  const TorchFile f = TorchFile::from_bytes(label, bytes);
  const Value& root = f.root();
  const Value* states = root.kind == Kind::List && root.items.size() == 1 ? root.items[0] : nullptr;
  bool valid = states && states->kind == Kind::List && !states->items.empty();
  for (const Value* item : valid ? states->items : std::vector<Value*>{})
    for (const char* k :
         {"random_rng_state", "np_rng_state", "torch_rng_state", "cuda_rng_state", "rng_tracker_states"})
      valid = valid && item->kind == Kind::Dict && item->get(k);
  if (!valid)
    throw runtime_error(label + " holds " + pickle::describe(root) + ", not Megatron's list of generator states",
                        "load with --no-load-rng, or copy the iteration folder again from its source");
  return std::move(bytes);
}

std::string torch_dist_rank_object_key(const std::string& name, const TorchDistRank& r) {
  return name + "/shard_" + std::to_string(r.pp_rank) + "." + std::to_string(r.tp_rank) + "_" +
         std::to_string(r.pp_size) + "." + std::to_string(r.tp_size);
}

std::vector<std::string> summarize_torch_dist_checkpoint(const std::string& dir, int64_t iteration) {
  const std::string it_dir = checkpoint_iteration_dir(dir, iteration);
  const DcpMetadata meta = read_dcp_metadata(it_dir);
  ChunkReader reader(it_dir);
  std::vector<std::string> lines;
  for (const DcpTensor& t : meta.tensors) {
    for (const DcpChunk& c : t.chunks) reader.read(t, c);
    lines.push_back(t.key + "  " + t.dtype.substr(t.dtype.find('.') + 1) + " " +
                    shape_str(Shape(t.size.begin(), t.size.end())) + "  " + std::to_string(t.chunks.size()) +
                    (t.chunks.size() == 1 ? " chunk" : " chunks"));
  }
  lines.push_back(std::to_string(meta.byte_objects.size()) + " byte objects (_extra_state, ...), not read");
  return lines;
}

// ---- Writing --------------------------------------------------------------------------------

namespace {

// tessera's layer name -> the stacked key's part after "decoder.layers.": the local spec's
// sharded_state_dict_keys_map (megatron/core/models/gpt/gpt_layer_specs.py) spells the norms as
// Transformer Engine's fused ones, which Transformer Engine's spec has, but for an MoE layer's
// pre_mlp_layernorm (a TENorm of its own).
std::string torch_dist_layer_key(const std::string& rest, bool own_mlp_norm) {
  static const std::pair<const char*, const char*> kNorms[] = {
      {"input_layernorm.", "self_attention.linear_qkv.layer_norm_"},
      {"pre_mlp_layernorm.", "mlp.linear_fc1.layer_norm_"}};
  for (const auto& [from, to] : kNorms)
    if (rest.starts_with(from) && !(own_mlp_norm && std::strcmp(from, "pre_mlp_layernorm.") == 0))
      return to + rest.substr(std::strlen(from));
  return rest;
}

// A tessera parameter's global key and its entries on the leading axes: the layer (-1 when the
// key numbers it, or outside the layers) and the expert (-1: none).
struct TorchDistKey {
  std::string key;
  int64_t layer = -1, expert = -1;
  size_t leading() const { return (layer >= 0 ? 1 : 0) + (expert >= 0 ? 1 : 0); }
};

TorchDistKey torch_dist_key(const std::string& name, const TorchDistShard& shard) {
  const std::string root = "decoder.layers.";
  if (!name.starts_with(root)) return {name};
  const size_t dot = name.find('.', root.size());
  const std::string number = name.substr(root.size(), dot - root.size());
  std::string rest = name.substr(dot + 1);
  int64_t expert = -1;
  if (rest.starts_with(kExpertsName)) {
    const size_t end = rest.find('.', kExpertsName.size());
    expert = std::stoll(rest.substr(kExpertsName.size(), end - kExpertsName.size()));
    rest = std::string(kExpertsKey) + rest.substr(end + 1);
  }
  const size_t layer = std::stoull(number);
  const bool moe = layer < shard.moe_layers.size() && shard.moe_layers[layer];
  rest = torch_dist_layer_key(rest, shard.transformer_engine && moe);
  if (shard.numbered_layers) return {root + number + "." + rest, -1, expert};
  return {root + rest, std::stoll(number), expert};
}

// A shape or offsets with the leading axes' entries put first (layer, then expert).
Shape with_leading(Shape s, const TorchDistKey& k, int64_t layer, int64_t expert) {
  if (k.expert >= 0) s.insert(s.begin(), expert);
  if (k.layer >= 0) s.insert(s.begin(), layer);
  return s;
}

std::string torch_dtype_name(DType t) {
  switch (t) {
    case DType::F32: return "torch.float32";
    case DType::BF16: return "torch.bfloat16";
    case DType::F16: return "torch.float16";
    default: throw runtime_error("a torch_dist checkpoint holds floating-point tensors, not " +
                                 std::string(dtype_name(t)));
  }
}

// One chunk to write: `bytes` makes its elements (row-major, `dtype`) when the file reaches it.
struct WriteChunk {
  std::string key;
  DType dtype = DType::F32;
  Shape global, offsets, sizes;
  std::function<std::vector<uint8_t>()> bytes;
  Shape reformulated_from;  // a reformulated tensor's original shape (mcore_data), else empty
};

std::vector<uint8_t> tensor_bytes(const Tensor& t) {
  std::vector<uint8_t> b(t.bytes());
  read_tensor_bytes(t, b.data());
  return b;
}

// A torch.save of one contiguous tensor: the payload DCP's FileSystemWriter stores per chunk.
void append_tensor_payload(const zip::StoredWriter::Append& append, const WriteChunk& c) {
  pickle::Document doc;
  pickle::TensorRef t{{"0", ChunkReader::storage_type(torch_dtype_name(c.dtype)), "cpu", shape_numel(c.sizes)},
                      0,
                      {c.sizes.begin(), c.sizes.end()},
                      std::vector<int64_t>(c.sizes.size())};
  int64_t stride = 1;
  for (size_t d = c.sizes.size(); d-- > 0;) {
    t.stride[d] = stride;
    stride *= c.sizes[d];
  }
  doc.root = doc.tensor(std::move(t));
  write_torch_file(append, "archive", *doc.root, {{"0", c.bytes}});
}

// torch.save([state]): a module's _extra_state (megatron_layer_spec.h) as a ShardedObject's bytes.
void append_extra_state_payload(const zip::StoredWriter::Append& append, MegatronExtraState extra) {
  pickle::Document doc;
  megatron::FileTensors tensors(doc);
  doc.root = doc.list({megatron_extra_state_value(doc, tensors, extra)});
  write_torch_file(append, "archive", *doc.root, tensors.storages());
}

// The chunks of one tessera tensor as Megatron's sharded_state_dict cuts them: the layer axis
// leading (one chunk per layer), SwiGLU's fc1 as its W and V chunks.
void add_chunks(std::vector<WriteChunk>& out, const ShardedTensor& t, const std::string& prefix,
                const TorchDistShard& shard) {
  const TorchDistKey k = torch_dist_key(t.name, shard);
  const std::string& key = k.key;
  const bool gated = shard.swiglu && is_gated_fc1(t.name);
  if (t.split_dim < 0 && !gated && shard.tp_rank != 0) return;  // TP rank 0's is the main replica
  Shape global = t.global_shape, offsets(global.size(), 0), sizes = t.tensor.shape;
  if (t.split_dim >= 0) offsets[static_cast<size_t>(t.split_dim)] = t.offset;
  // The global shape, offsets and sizes with the layer and expert axes leading.
  auto whole = [&](Shape s) { return with_leading(std::move(s), k, shard.num_layers, shard.num_experts); };
  auto at = [&](Shape s) { return with_leading(std::move(s), k, k.layer, k.expert); };
  auto one = [&](Shape s) { return with_leading(std::move(s), k, 1, 1); };
  const Tensor tensor = t.tensor;
  const DType dtype = tensor.dtype;
  if (!gated) {
    out.push_back({prefix + key, dtype, whole(global), at(offsets), one(sizes), [tensor] { return tensor_bytes(tensor); }});
    return;
  }
  // tessera's [2, F, ...] slice [2, r, ...] at row o: Megatron's W rows [o, o + r) and V rows
  // [F + o, F + o + r) of [2F, ...] (megatron/core/transformer/mlp.py apply_swiglu_sharded_factory).
  const int64_t f = global[1];
  Shape mg_global(global.begin() + 1, global.end()), half(sizes.begin() + 1, sizes.end());
  mg_global[0] = 2 * f;
  const int64_t row = t.split_dim == 1 ? t.offset : 0;
  for (int64_t h = 0; h < 2; ++h) {
    Shape off(mg_global.size(), 0);
    off[0] = h * f + row;
    out.push_back({prefix + key, dtype, whole(mg_global), at(off), one(half), [tensor, h] {
                     const std::vector<uint8_t> b = tensor_bytes(tensor);
                     const size_t n = b.size() / 2;
                     return std::vector<uint8_t>(b.begin() + static_cast<std::ptrdiff_t>(h * n),
                                                 b.begin() + static_cast<std::ptrdiff_t>((h + 1) * n));
                   }});
  }
}

// The placement of a flat piece's parameter in Megatron's model space: its original global
// shape, its TP-local block and that block's coordinates among the blocks, with the layer axis
// leading; SwiGLU's fc1 as [W of every rank; V of every rank], whose V block of this rank lies
// `v_blocks` further along the row axis.
struct FlatPlacement {
  Shape global, block, coords;
  int64_t v_blocks = 0;
  size_t row_axis = 0;
};

FlatPlacement flat_placement(const ShardedTensor& t, const TorchDistKey& k, bool gated, const TorchDistShard& shard) {
  FlatPlacement p;
  p.global = t.global_shape;
  p.block = t.tensor.shape;
  p.coords.assign(p.global.size(), 0);
  if (t.split_dim >= 0) {
    const size_t split = static_cast<size_t>(t.split_dim);
    p.coords[split] = t.offset / p.block[split];
  }
  if (gated) {
    // tessera's [2, F, ...] slice [2, f, ...] at row o: Megatron's [2F, ...] in blocks [f, ...],
    // W at row block o / f, V at F / f + o / f (megatron/core/transformer/mlp.py).
    const int64_t f = p.block[1], rows = p.global[1];
    p.global.erase(p.global.begin());
    p.global[0] = 2 * rows;
    p.block.erase(p.block.begin());
    p.coords.assign(p.global.size(), 0);
    p.coords[0] = (t.split_dim == 1 ? t.offset : 0) / f;
    p.v_blocks = rows / f;
  }
  p.global = with_leading(p.global, k, shard.num_layers, shard.num_experts);
  p.block = with_leading(p.block, k, 1, 1);
  p.coords = with_leading(p.coords, k, k.layer, k.expert);
  p.row_axis = k.leading();
  return p;
}

// Elements [begin, end) of the block at `coords` as a chunk: of the reformulated tensor
// [blocks..., block numel] (sharded_tensor_to_torch_sharded_tensor in megatron/core/
// dist_checkpointing/strategies/torch.py), or of a 1-D tensor itself; `from` is where its
// elements start in `values`.
WriteChunk flat_chunk(const std::string& key, const FlatPlacement& p, const Shape& coords, int64_t begin, int64_t end,
                      const Tensor& values, int64_t from) {
  WriteChunk c;
  c.key = key;
  c.dtype = values.dtype;
  if (p.global.size() == 1) {
    c.global = p.global;
    c.offsets = {coords[0] * p.block[0] + begin};
    c.sizes = {end - begin};
  } else {
    for (size_t d = 0; d < p.global.size(); ++d) c.global.push_back(p.global[d] / p.block[d]);
    c.global.push_back(shape_numel(p.block));
    c.offsets = coords;
    c.offsets.push_back(begin);
    c.sizes.assign(p.global.size(), 1);
    c.sizes.push_back(end - begin);
    c.reformulated_from = p.global;
  }
  const size_t element = dtype_size(values.dtype);
  c.bytes = [values, from, n = end - begin, element] {
    const std::vector<uint8_t> all = tensor_bytes(values);
    const auto at = all.begin() + static_cast<std::ptrdiff_t>(from * static_cast<int64_t>(element));
    return std::vector<uint8_t>(at, at + static_cast<std::ptrdiff_t>(n * static_cast<int64_t>(element)));
  };
  return c;
}

// The chunks of one distributed-optimizer range (fully_sharded_model_space): its block's range,
// or a SwiGLU fc1 range cut where its W half ends.
void add_flat_chunks(std::vector<WriteChunk>& out, const FlatPiece& piece, const std::string& prefix,
                     const TorchDistShard& shard) {
  const ShardedTensor& t = piece.slice;
  const TorchDistKey k = torch_dist_key(t.name, shard);
  const std::string& key = k.key;
  const bool gated = shard.swiglu && is_gated_fc1(t.name);
  if (t.split_dim < 0 && !gated && shard.tp_rank != 0) return;  // TP rank 0's is the main replica
  const FlatPlacement p = flat_placement(t, k, gated, shard);
  if (!gated) {
    out.push_back(flat_chunk(prefix + key, p, p.coords, piece.begin, piece.end, piece.values, 0));
    return;
  }
  const int64_t half = shape_numel(p.block);
  if (piece.begin < half)
    out.push_back(flat_chunk(prefix + key, p, p.coords, piece.begin, std::min(piece.end, half), piece.values, 0));
  if (piece.end > half) {
    Shape v = p.coords;
    v[p.row_axis] += p.v_blocks;
    const int64_t begin = std::max(piece.begin, half);
    out.push_back(flat_chunk(prefix + key, p, v, begin - half, piece.end - half, piece.values, begin - piece.begin));
  }
}

json shape_json(const Shape& s) { return json(std::vector<int64_t>(s.begin(), s.end())); }

}  // namespace

bool torch_dist_numbered_layers(const json& args) {
  const auto freq = args.find("moe_layer_freq");
  if (args.value("num_experts", json()).is_null() || freq == args.end()) return false;
  return freq->is_array() || (freq->is_number_integer() && freq->get<int64_t>() > 1);
}

json write_torch_dist_shard(const std::string& tmp_dir, int rank, const TorchDistShard& shard) {
  std::vector<WriteChunk> chunks;
  for (const ShardedTensor& t : shard.params) add_chunks(chunks, t, "", shard);
  for (const ShardedTensor& t : shard.main) add_chunks(chunks, t, std::string(kOptimizerPrefix) + "fp32_param.", shard);
  for (const ShardedTensor& t : shard.state) {
    const size_t dot = t.name.find('.');
    ShardedTensor param = t;
    param.name = t.name.substr(dot + 1);
    add_chunks(chunks, param, std::string(kOptimizerPrefix) + t.name.substr(0, dot + 1), shard);
  }
  for (const FlatPiece& p : shard.flat_state) {
    const size_t dot = p.slice.name.find('.');
    FlatPiece param = p;
    param.slice.name = p.slice.name.substr(dot + 1);
    add_flat_chunks(chunks, param, std::string(kOptimizerPrefix) + p.slice.name.substr(0, dot + 1), shard);
  }
  const std::string file = "__" + std::to_string(rank) + "_0.distcp";
  SyncedFileWriter out((fs::path(tmp_dir) / file).string());
  uint64_t offset = 0;
  const zip::StoredWriter::Append append = [&](std::span<const uint8_t> b) {
    out.append({reinterpret_cast<const char*>(b.data()), b.size()});
    offset += b.size();
  };
  json records = json::array();
  for (const WriteChunk& c : chunks) {
    throw_if_save_interrupted();
    const uint64_t start = offset;
    append_tensor_payload(append, c);
    records.push_back({{"key", c.key}, {"dtype", torch_dtype_name(c.dtype)}, {"size", shape_json(c.global)},
                       {"offsets", shape_json(c.offsets)}, {"sizes", shape_json(c.sizes)}, {"file", file},
                       {"offset", start}, {"length", offset - start}});
    if (!c.reformulated_from.empty()) records.back()["reformulated_from"] = shape_json(c.reformulated_from);
  }
  // The modules' _extra_state, one ShardedObject per layer's (and expert's) module, replicated
  // over TP: key/shard_<offsets>_<shape> over the leading axes, or shard_0_1 without
  // (megatron/core/dist_checkpointing/mapping.py ShardedObject.unique_key,
  // megatron/core/transformer/utils.py _get_extra_state_offsets).
  std::vector<std::string> names;
  for (const ShardedTensor& t : shard.tp_rank == 0 ? shard.params : std::vector<ShardedTensor>{})
    names.push_back(t.name);
  for (const auto& [name, extra] : torch_dist_extra_states(shard.transformer_engine, names)) {
    const TorchDistKey k = torch_dist_key(name, shard);
    auto dotted = [](const Shape& s) {
      std::string out;
      for (int64_t x : s) out += (out.empty() ? "" : ".") + std::to_string(x);
      return out;
    };
    const Shape at = k.leading() ? with_leading({}, k, k.layer, k.expert) : Shape{0};
    const Shape of = k.leading() ? with_leading({}, k, shard.num_layers, shard.num_experts) : Shape{1};
    const uint64_t start = offset;
    append_extra_state_payload(append, extra);
    records.push_back({{"key", k.key.substr(0, k.key.size() - std::strlen("weight")) + "_extra_state/shard_" +
                                   dotted(at) + "_" + dotted(of)},
                       {"file", file},
                       {"offset", start},
                       {"length", offset - start}});
  }
  // The rank's objects of the (PP, TP) grid.
  const TorchDistRank grid_rank{shard.tp_rank, shard.tp_size, shard.pp_rank, shard.pp_size};
  for (const auto& [name, payload] : {std::pair{"rng_state", &shard.rng_state},
                                      std::pair{"rerun_state_machine_state", &shard.rerun_state}}) {
    if (!*payload) continue;
    const uint64_t start = offset;
    (*payload)(append);
    records.push_back({{"key", torch_dist_rank_object_key(name, grid_rank)},
                       {"file", file},
                       {"offset", start},
                       {"length", offset - start}});
  }
  out.finish();
  return records;
}

namespace {

pickle::Value* torch_size(pickle::Document& doc, const json& dims) {
  std::vector<pickle::Value*> items;
  for (const json& d : dims) items.push_back(doc.integer(d.get<int64_t>()));
  return doc.object("torch.Size", {doc.tuple(std::move(items))});
}

pickle::Value* dcp_record(pickle::Document& doc, const char* cls) {
  return doc.object(std::string("torch.distributed.checkpoint.") + cls);
}

// TensorProperties' __getstate__: (dtype, layout, requires_grad, memory format, pin_memory).
pickle::Value* tensor_properties(pickle::Document& doc, const std::string& dtype) {
  Value* p = dcp_record(doc, "metadata.TensorProperties");
  p->state = doc.tuple({doc.global(dtype), doc.object("torch.serialization._get_layout", {doc.str("torch.strided")}),
                        doc.boolean(false),
                        doc.object("torch.distributed.checkpoint.metadata._MEM_FORMAT_ENCODING", {doc.integer(0)}),
                        doc.boolean(false)});
  return p;
}

// The pickled Metadata (torch/distributed/checkpoint/metadata.py) of every rank's records.
std::vector<uint8_t> dcp_metadata_pickle(const std::vector<json>& records) {
  pickle::Document doc;
  Value* tensors = doc.dict();
  Value* storage = doc.dict();
  Value* planner = doc.dict();
  Value* mcore = doc.dict();
  std::map<std::string, Value*> chunk_lists;
  for (const json& rank_records : records)
    for (const json& r : rank_records) {
      const std::string key = r.at("key");
      Value* index = dcp_record(doc, "metadata.MetadataIndex");
      doc.set(index, "fqn", doc.str(key));
      if (!r.contains("size")) {  // a byte object
        doc.set(tensors, key, dcp_record(doc, "metadata.BytesStorageMetadata"));
        doc.set(planner, key, doc.tuple({doc.str(key)}));
        doc.set(index, "offset", doc.none());
        doc.set(index, "index", doc.none());
      } else {
        auto [it, fresh] = chunk_lists.emplace(key, nullptr);
        if (fresh) {
          Value* meta = dcp_record(doc, "metadata.TensorStorageMetadata");
          doc.set(meta, "properties", tensor_properties(doc, r.at("dtype")));
          doc.set(meta, "size", torch_size(doc, r.at("size")));
          it->second = doc.list();
          doc.set(meta, "chunks", it->second);
          doc.set(tensors, key, meta);
          // megatron-core's MCoreSavePlanner: each tensor's mcore_metadata, the original shape
          // of a reformulated one.
          Value* mcore_meta = doc.dict();
          if (r.contains("reformulated_from")) {
            std::vector<Value*> dims;
            for (const json& d : r.at("reformulated_from")) dims.push_back(doc.integer(d.get<int64_t>()));
            doc.set(mcore_meta, "nd_reformulated_orig_global_shape", doc.tuple(std::move(dims)));
          }
          doc.set(mcore, key, mcore_meta);
          doc.set(planner, key, doc.tuple({doc.str(key)}));
        }
        Value* chunk = dcp_record(doc, "metadata.ChunkStorageMetadata");
        doc.set(chunk, "offsets", torch_size(doc, r.at("offsets")));
        doc.set(chunk, "sizes", torch_size(doc, r.at("sizes")));
        doc.set(index, "offset", torch_size(doc, r.at("offsets")));
        doc.set(index, "index", doc.integer(static_cast<int64_t>(it->second->items.size())));
        it->second->items.push_back(chunk);
      }
      Value* info = dcp_record(doc, "filesystem._StorageInfo");
      doc.set(info, "relative_path", doc.str(r.at("file")));
      doc.set(info, "offset", doc.integer(r.at("offset").get<int64_t>()));
      doc.set(info, "length", doc.integer(r.at("length").get<int64_t>()));
      doc.set(storage, index, info);
    }
  Value* root = dcp_record(doc, "metadata.Metadata");
  doc.set(root, "state_dict_metadata", tensors);
  doc.set(root, "planner_data", planner);
  doc.set(root, "storage_data", storage);
  doc.set(root, "mcore_data", mcore);
  doc.root = root;
  return pickle::dump(*root);
}

void write_file(const fs::path& path, std::span<const uint8_t> bytes) {
  SyncedFileWriter out(path.string());
  out.append({reinterpret_cast<const char*>(bytes.data()), bytes.size()});
  out.finish();
}

}  // namespace

void write_torch_dist_index(const std::string& tmp_dir, const std::vector<json>& records, const MegatronFileSpec& spec,
                            const std::vector<bool>& group_weight_decay) {
  write_file(fs::path(tmp_dir) / kMetadataName, dcp_metadata_pickle(records));
  write_torch_dist_common((fs::path(tmp_dir) / kCommonFile).string(), spec, group_weight_decay);
  // megatron/core/dist_checkpointing/core.py CheckpointingConfig, as save_config writes it.
  const std::string config = json{{"sharded_backend", "torch_dist"},
                                  {"sharded_backend_version", 1},
                                  {"common_backend", "torch"},
                                  {"common_backend_version", 1}}
                                 .dump();
  write_file(fs::path(tmp_dir) / "metadata.json", {reinterpret_cast<const uint8_t*>(config.data()), config.size()});
}

}  // namespace tessera
