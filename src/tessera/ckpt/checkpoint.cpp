#include "tessera/ckpt/checkpoint.h"

#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <cctype>
#include <cerrno>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <map>
#include <memory>

#include "tessera/ckpt/megatron_checkpoint.h"
#include "tessera/ckpt/torch_dist.h"
#include "tessera/ckpt/safetensors.h"
#include "tessera/ckpt/save_owner.h"
#include "tessera/core/error.h"
#include "tessera/core/file_io.h"
#include "tessera/core/sha256.h"
#include "tessera/device/host_staging.h"

namespace tessera {
namespace {

namespace fs = std::filesystem;
using json = nlohmann::json;

// The signal a SaveSignalScope recorded (0: none); written from a signal handler.
std::atomic<int> g_save_signal{0};
static_assert(std::atomic<int>::is_always_lock_free, "the save signal is set from a signal handler");
constexpr int kSaveSignals[2] = {SIGINT, SIGTERM};

extern "C" void record_save_signal(int sig) { g_save_signal.store(sig); }

constexpr const char* kTracker = "latest_checkpointed_iteration.txt";
constexpr const char* kModelFile = "model.safetensors";
constexpr const char* kOptimizerFile = "optimizer.safetensors";
constexpr const char* kOptimizerDpPrefix = "optimizer_dp_";  // + 3 digits + ".safetensors"
// 1: one whole-model shard, optimizer state by parameter index. 2: sharded (TP/PP), layout
// and padded vocabulary recorded, optimizer state by parameter name.
constexpr int kFormatVersion = 2;

std::string placement_text(const ShardedTensor& t) {
  Shape offset(t.global_shape.size(), 0);
  if (t.split_dim >= 0) offset[t.split_dim] = t.offset;
  return "global_shape=" + shape_str(t.global_shape) + ";split_dim=" + std::to_string(t.split_dim) +
         ";offset=" + shape_str(offset);
}

// A flat piece's placement: its slice's, the slice's shape and the piece's elements in it.
std::string placement_text(const FlatPiece& p) {
  return placement_text(p.slice) + ";slice_shape=" + shape_str(p.slice.tensor.shape) + ";flat=" +
         shape_str({p.begin, p.end});
}

// A tensor as a file holds it: its name, its values, its placement text and the dtype the
// file stores (the tensor's, or F32 for a 16-bit tensor written widened).
struct FileTensor {
  std::string name;
  Tensor tensor;
  std::string placement;
  DType stored;
};

// The dtype a tensor is stored as under `storage`.
DType stored_dtype(DType dtype, FloatStorage storage) {
  const bool half = dtype == DType::BF16 || dtype == DType::F16;
  return half && storage == FloatStorage::WidenToF32 ? DType::F32 : dtype;
}

// A staged piece of 16-bit values (`dtype`), widened to f32 (exact) in `wide`.
void widen_piece(const void* piece, size_t bytes, DType dtype, std::vector<float>& wide) {
  wide.resize(bytes / sizeof(uint16_t));
  widen_16bit(static_cast<const uint16_t*>(piece), wide.size(), dtype, wide.data());
}

// A tensor without a device is host memory: the CPU device's (its handle is the address).
Tensor on_a_device(Tensor t) {
  if (!t.device) t.device = &cpu_device();
  return t;
}

// Writes the safetensors file of `tensors`, each with its placement in the metadata, to
// `path`: each tensor staged from its device through one bounded host buffer (a widened one
// through a second, twice the piece), so no host copy of the whole file is ever made.
// Returns the file's checksum and size (path relative to the iteration folder: `rel`).
CheckpointFile write_tensors_file(const std::string& path, const std::string& rel,
                                  const std::vector<FileTensor>& tensors) {
  std::vector<safetensors::WriteEntry> entries;
  std::map<std::string, std::string> metadata{{"format", "tessera-checkpoint"}};
  size_t largest = 1;
  for (const FileTensor& t : tensors) {
    entries.push_back({t.name, t.stored, t.tensor.shape, nullptr});
    metadata[t.name] = t.placement;
    largest = std::max(largest, t.tensor.bytes());
  }
  SyncedFileWriter file(path);
  Sha256 sha;
  CheckpointFile written{rel, "", 0};
  auto append = [&](const void* piece, size_t bytes) {
    throw_if_save_interrupted();
    file.append({static_cast<const char*>(piece), bytes});
    sha.update({static_cast<const unsigned char*>(piece), bytes});
    written.bytes += bytes;
  };
  const std::vector<uint8_t> header = safetensors::serialize_header(entries, metadata);
  append(header.data(), header.size());
  std::unique_ptr<HostStaging> stage;  // for the device of the tensors (in practice one)
  Device* staged_device = nullptr;
  std::vector<float> wide;
  for (const FileTensor& t : tensors) {
    const Tensor src = on_a_device(t.tensor);
    if (src.device != staged_device) {
      stage.reset();  // one pinned buffer at a time
      stage = std::make_unique<HostStaging>(*src.device, std::min(largest, HostStaging::kDefaultBytes));
      staged_device = src.device;
    }
    if (src.bytes() == 0) continue;
    if (t.stored == src.dtype) {
      stage->read(src, append);
      continue;
    }
    stage->read(src, [&](const void* piece, size_t bytes) {
      widen_piece(piece, bytes, src.dtype, wide);
      append(wide.data(), wide.size() * sizeof(float));
    });
  }
  file.finish();
  written.sha256 = sha.hex();
  return written;
}

// "[64, 32]" -> {64, 32}; nullopt unless it is exactly a bracketed list of integers >= 0.
std::optional<Shape> parse_list(std::string_view s) {
  if (s.size() < 2 || s.front() != '[' || s.back() != ']') return std::nullopt;
  s = s.substr(1, s.size() - 2);
  Shape out;
  while (!s.empty()) {
    while (!s.empty() && s.front() == ' ') s.remove_prefix(1);
    size_t n = 0;
    int64_t v = 0;
    while (n < s.size() && std::isdigit(static_cast<unsigned char>(s[n]))) {
      if (v > (INT64_MAX - 9) / 10) return std::nullopt;
      v = v * 10 + (s[n++] - '0');
    }
    if (n == 0 || out.size() >= 16) return std::nullopt;
    out.push_back(v);
    s.remove_prefix(n);
    if (s.empty()) break;
    if (s.front() != ',') return std::nullopt;
    s.remove_prefix(1);
    if (s.empty()) return std::nullopt;
  }
  return out;
}

std::string shard_of(const std::string& rel) { return fs::path(rel).parent_path().string(); }

// Whether a file name is of a kind: "model.safetensors"; "optimizer.safetensors" takes the
// distributed optimizer's data-parallel files too.
bool is_of_kind(const std::string& name, const std::string& kind) {
  return name == kind || (kind == kOptimizerFile && name.rfind(kOptimizerDpPrefix, 0) == 0);
}

// ---- Loading -------------------------------------------------------------------------------

struct SourceFile {
  std::string rel, path;
  std::string sha256;
  uint64_t bytes = 0;
  int tp_rank = -1;  // of its shard folder ("mp_rank_01_002": 1)
};

int tp_rank_of_shard(const std::string& shard) {
  if (shard.size() < 10 || shard.rfind("mp_rank_", 0) != 0 || !std::isdigit(static_cast<unsigned char>(shard[8])) ||
      !std::isdigit(static_cast<unsigned char>(shard[9])))
    return -1;
  return (shard[8] - '0') * 10 + (shard[9] - '0');
}

// Elements [begin, end) of a slice, held by one file (a data-parallel shard).
struct FlatPart {
  size_t file;
  int64_t begin, end;
};

// A saved piece of a tensor: where it sits in the global tensor.
struct Piece {
  size_t file;  // index into the sources (a joined piece: its first part's)
  Shape shape;  // as saved
  TensorPlacement place;
  size_t id = 0;  // an external piece's index (load_external_pieces)
  // A slice the distributed optimizer saved in flat parts, one per data-parallel file,
  // joined into the slice when copied from (empty: the file holds the piece whole).
  std::vector<FlatPart> parts;
};

// The value of `key` in a placement text ("flat" in "...;flat=[0, 960]"), or nullopt.
std::optional<std::string> placement_item(const std::string& text, const std::string& key) {
  size_t start = 0;
  while (start <= text.size()) {
    size_t end = text.find(';', start);
    if (end == std::string::npos) end = text.size();
    if (text.compare(start, key.size() + 1, key + "=") == 0)
      return text.substr(start + key.size() + 1, end - start - key.size() - 1);
    start = end + 1;
  }
  return std::nullopt;
}

// A flat piece's slice placement and its [begin, end) in the slice, checked against the
// piece's own 1-D shape; nullopt when the text does not describe one.
struct FlatPlacement {
  Shape slice_shape;
  TensorPlacement place;
  int64_t begin = 0, end = 0;
};
std::optional<FlatPlacement> parse_flat_placement(const std::string& text, const Shape& local) {
  const std::optional<std::string> slice = placement_item(text, "slice_shape"), flat = placement_item(text, "flat");
  if (!slice || !flat) return std::nullopt;
  const std::optional<Shape> slice_shape = parse_list(*slice), range = parse_list(*flat);
  if (!slice_shape || !range || range->size() != 2 || local.size() != 1) return std::nullopt;
  const std::optional<TensorPlacement> place = parse_tensor_placement(text, *slice_shape);
  const int64_t begin = (*range)[0], end = (*range)[1];
  if (!place || begin > end || end > shape_numel(*slice_shape) || local[0] != end - begin) return std::nullopt;
  return FlatPlacement{*slice_shape, *place, begin, end};
}

// One copy: elements [begin, end) along dim of the global tensor, from a saved piece to a
// local slice.
struct CopyOp {
  size_t target;
  int dim;  // -1: the whole tensor
  int64_t begin = 0, end = 0;
  int64_t src_start = 0, dst_start = 0;  // where the piece and the slice start along dim
  Shape src_shape;
  size_t piece = 0;  // the piece's id
  const Piece* joined = nullptr;  // a piece saved in flat parts
};

Error checksum_error(const std::string& path) {
  return runtime_error("checkpoint file " + path + " is corrupt or truncated (checksum mismatch)",
                       "load an earlier iteration (edit " + std::string(kTracker) + ") or re-save");
}

// Whether the file has its recorded size and SHA-256, read through one 1 MiB block.
bool checksum_ok(const SourceFile& src) {
  std::FILE* f = std::fopen(src.path.c_str(), "rb");
  if (!f) throw runtime_error("cannot read checkpoint file " + src.path + ": " + std::strerror(errno));
  Sha256 sha;
  std::vector<unsigned char> block(size_t{1} << 20);
  uint64_t total = 0;
  while (size_t n = std::fread(block.data(), 1, block.size(), f)) {
    sha.update({block.data(), n});
    total += n;
  }
  const bool failed = std::ferror(f);
  std::fclose(f);
  if (failed) throw runtime_error("reading checkpoint file " + src.path + " failed");
  return total == src.bytes && sha.hex() == src.sha256;
}

// Whether saved values of `saved` fill a target of `target`: the same dtype, or F32 into a
// 16-bit target (rounded to nearest even: a 16-bit model from f32 values).
bool loads_into(DType saved, DType target) {
  return saved == target || (saved == DType::F32 && (target == DType::BF16 || target == DType::F16));
}

// The pieces of every tensor of a kind of file (model or optimizer), by name, from the
// (unverified, bounds-checked) headers; the data is read and verified only when copied.
class PieceIndex {
 public:
  PieceIndex(const std::string& it_dir, std::vector<SourceFile> sources) : it_dir_(it_dir), sources_(std::move(sources)) {
    for (size_t f = 0; f < sources_.size(); ++f) {
      const SourceFile& src = sources_[f];
      if (!fs::exists(src.path))
        throw runtime_error("checkpoint file " + src.path + " is missing",
                            "the shard folder " + shard_of(src.rel) + " is missing or incomplete; copy the whole " +
                                fs::path(it_dir).filename().string() + " folder" +
                                (is_of_kind(fs::path(src.rel).filename().string(), kOptimizerFile)
                                     ? ", or pass --no-load-optim to load the model alone"
                                     : ""));
      // Headers only locate the tensors; the data is verified before any copy.
      if (fs::file_size(src.path) != src.bytes) throw checksum_error(src.path);
      const safetensors::Reader r = safetensors::Reader::open(src.path);
      for (const safetensors::TensorInfo& info : r.tensors()) {
        Piece p{f, info.shape, {}, 0, {}};
        auto meta = r.metadata().find(info.name);
        if (meta != r.metadata().end() && placement_item(meta->second, "flat")) {
          add_flat_part(f, info, meta->second);
          continue;
        }
        if (meta == r.metadata().end()) {
          p.place.global_shape = info.shape;  // a whole tensor
        } else if (auto place = parse_tensor_placement(meta->second, info.shape)) {
          p.place = *place;
        } else {
          throw runtime_error(src.path + ": tensor " + info.name + " has an invalid placement '" +
                                  meta->second.substr(0, 120) + "' for its shape " + shape_str(info.shape),
                              "the file is corrupt; load an earlier iteration or re-save");
        }
        if (!info.dtype)
          throw runtime_error(src.path + ": tensor " + info.name + " has dtype " + info.dtype_name +
                              ", which tessera checkpoints never hold");
        dtypes_[info.name] = *info.dtype;
        pieces_[info.name].push_back(std::move(p));
      }
    }
    check_joined_pieces();
  }

  // Pieces saved in another format, already located (load_external_pieces); read as F32.
  PieceIndex(const std::string& it_dir, std::vector<SourceFile> sources, const std::vector<ExternalPiece>& pieces)
      : it_dir_(it_dir), sources_(std::move(sources)) {
    for (size_t i = 0; i < pieces.size(); ++i) {
      dtypes_[pieces[i].name] = DType::F32;
      pieces_[pieces[i].name].push_back({pieces[i].source, pieces[i].shape, pieces[i].place, i, {}});
    }
  }

  const std::vector<SourceFile>& sources() const { return sources_; }

  DType dtype(const std::string& name) const { return dtypes_.at(name); }

  // The copies that fill `target` (targets[index]; the copies cover its whole slice),
  // preferring pieces of saved TP rank `preferred`.
  void plan(const FlatPiece& target, size_t index, int preferred, const char* what,
            std::vector<std::vector<CopyOp>>& ops_by_file) const {
    const ShardedTensor& t = target.slice;
    auto it = pieces_.find(t.name);
    if (it == pieces_.end())
      throw runtime_error("checkpoint " + it_dir_ + " lacks " + what + " " + t.name + " (in none of its " +
                              std::to_string(sources_.size()) + " " + what + " files)",
                          "the checkpoint belongs to another model; load with the model flags it was saved with "
                          "(see its metadata.json)");
    std::vector<const Piece*> pieces;
    for (const Piece& p : it->second) pieces.push_back(&p);
    std::stable_sort(pieces.begin(), pieces.end(), [&](const Piece* a, const Piece* b) {
      return (sources_[a->file].tp_rank == preferred) > (sources_[b->file].tp_rank == preferred);
    });
    const DType dtype = dtypes_.at(t.name);
    for (const Piece* p : pieces) {
      if (p->place.global_shape != t.global_shape || !loads_into(dtype, target.values.dtype))
        throw runtime_error(sources_[p->file].path + ": tensor " + t.name + " is " +
                                std::string(safetensors::dtype_to_name(dtype)) + " " + shape_str(p->place.global_shape) +
                                ", the model expects " + std::string(safetensors::dtype_to_name(target.values.dtype)) +
                                " " + shape_str(t.global_shape),
                            "load with the model flags the checkpoint was saved with (see its metadata.json)");
    }
    const Shape& g = t.global_shape;
    if (g.empty()) {  // a scalar: any piece is the whole
      const Piece* p = pieces.front();
      ops_by_file[p->file].push_back({index, -1, 0, 1, 0, 0, p->shape, p->id, p->parts.empty() ? nullptr : p});
      return;
    }
    // The dimension the slices are taken along: the run's split, else the saved one.
    int dim = t.split_dim;
    for (const Piece* p : pieces)
      if (dim < 0 && p->place.split_dim >= 0) dim = p->place.split_dim;
    if (dim < 0) dim = 0;
    for (const Piece* p : pieces)
      if (p->place.split_dim >= 0 && p->place.split_dim != dim)
        throw runtime_error(sources_[p->file].path + ": tensor " + t.name + " is split along dimension " +
                            std::to_string(p->place.split_dim) + ", this run splits it along dimension " +
                            std::to_string(dim) + "; tessera cannot reshard between them");
    auto range = [&](int split, int64_t offset, const Shape& shape) {
      return split == dim ? std::pair{offset, offset + shape[dim]} : std::pair<int64_t, int64_t>{0, g[dim]};
    };
    const auto [need_begin, need_end] = range(t.split_dim, t.offset, t.tensor.shape);
    std::vector<std::pair<int64_t, int64_t>> covered;  // disjoint, unsorted
    int64_t covered_len = 0;
    for (const Piece* p : pieces) {
      if (covered_len == need_end - need_begin) break;
      const auto [pb, pe] = range(p->place.split_dim, p->place.offset, p->shape);
      int64_t b = std::max(pb, need_begin), e = std::min(pe, need_end);
      if (b >= e) continue;
      // The parts of [b, e) not filled yet (replicated pieces repeat; layouts never overlap
      // partially, but this does not rely on it).
      std::vector<std::pair<int64_t, int64_t>> todo{{b, e}};
      for (const auto& [cb, ce] : covered) {
        std::vector<std::pair<int64_t, int64_t>> next;
        for (const auto& [x, y] : todo) {
          if (ce <= x || cb >= y) {
            next.push_back({x, y});
            continue;
          }
          if (x < cb) next.push_back({x, cb});
          if (ce < y) next.push_back({ce, y});
        }
        todo = std::move(next);
      }
      for (const auto& [x, y] : todo) {
        ops_by_file[p->file].push_back({index, dim, x, y, pb, need_begin, p->shape, p->id,
                                        p->parts.empty() ? nullptr : p});
        covered.push_back({x, y});
        covered_len += y - x;
      }
    }
    if (covered_len != need_end - need_begin)
      throw runtime_error("checkpoint " + it_dir_ + " lacks part of " + what + " " + t.name + ": this rank needs [" +
                              std::to_string(need_begin) + ", " + std::to_string(need_end) + ") along dimension " +
                              std::to_string(dim) + " of " + shape_str(g) + ", its files hold only " +
                              std::to_string(covered_len) + " of those " + std::to_string(need_end - need_begin),
                          "a shard of the checkpoint is missing; copy the whole folder");
  }

 private:
  // A flat part of file f joins the other parts of its slice (same placement and shape).
  void add_flat_part(size_t f, const safetensors::TensorInfo& info, const std::string& text) {
    const std::optional<FlatPlacement> flat = parse_flat_placement(text, info.shape);
    if (!flat || info.dtype != DType::F32)
      throw runtime_error(sources_[f].path + ": tensor " + info.name + " has an invalid flat placement '" +
                              text.substr(0, 160) + "' for its shape " + shape_str(info.shape),
                          "the file is corrupt; load an earlier iteration or re-save");
    dtypes_[info.name] = DType::F32;
    std::vector<Piece>& pieces = pieces_[info.name];
    auto same_slice = [&](const Piece& p) {
      return !p.parts.empty() && p.shape == flat->slice_shape && p.place.global_shape == flat->place.global_shape &&
             p.place.split_dim == flat->place.split_dim && p.place.offset == flat->place.offset;
    };
    auto it = std::find_if(pieces.begin(), pieces.end(), same_slice);
    if (it == pieces.end()) it = pieces.insert(pieces.end(), Piece{f, flat->slice_shape, flat->place, 0, {}});
    if (flat->end > flat->begin) it->parts.push_back({f, flat->begin, flat->end});
  }

  // Every slice saved in flat parts must be covered by them exactly: a part missing means a
  // data-parallel file that metadata.json does not list (a file missing on disk is caught first).
  void check_joined_pieces() {
    for (auto& [name, pieces] : pieces_)
      for (Piece& p : pieces) {
        if (p.parts.empty()) continue;
        std::sort(p.parts.begin(), p.parts.end(), [](const FlatPart& a, const FlatPart& b) { return a.begin < b.begin; });
        int64_t at = 0;
        for (const FlatPart& part : p.parts)
          if (part.begin == at) at = part.end;
        if (at != shape_numel(p.shape))
          throw runtime_error("checkpoint " + it_dir_ + " lacks part of " + name + "'s slice " + shape_str(p.shape) +
                                  " in shard " + shard_of(sources_[p.parts.front().file].rel) +
                                  ": its data-parallel files hold its elements only up to " + std::to_string(at) +
                                  " of " + std::to_string(shape_numel(p.shape)),
                              "a data-parallel optimizer file (" + std::string(kOptimizerDpPrefix) +
                                  "NNN.safetensors) is missing from metadata.json; copy the whole folder");
        p.file = p.parts.front().file;
      }
  }

  std::string it_dir_;
  std::vector<SourceFile> sources_;
  std::map<std::string, std::vector<Piece>> pieces_;
  std::map<std::string, DType> dtypes_;
};

// Elements [first, first + count) of a target's slice, as `from` holds them in `dtype`: those
// within the target's [begin, end) go to its values, rounded (through a bounded buffer) where
// the values are 16-bit and the file's F32.
void write_slice_elements(const FlatPiece& t, int64_t first, int64_t count, const uint8_t* from, DType dtype) {
  const int64_t begin = std::max(first, t.begin), end = std::min(first + count, t.end);
  if (begin >= end) return;
  from += static_cast<size_t>(begin - first) * dtype_size(dtype);
  const size_t at = static_cast<size_t>(begin - t.begin) * dtype_size(t.values.dtype);
  if (dtype == t.values.dtype)
    return write_tensor_bytes(t.values, at, from, static_cast<size_t>(end - begin) * dtype_size(dtype));
  constexpr int64_t kRoundedRun = int64_t{1} << 20;  // elements rounded per copy to the device
  std::vector<uint16_t> bits(static_cast<size_t>(std::min(end - begin, kRoundedRun)));
  for (int64_t done = 0; done < end - begin; done += kRoundedRun) {
    const size_t n = static_cast<size_t>(std::min(end - begin - done, kRoundedRun));
    round_to_16bit(reinterpret_cast<const float*>(from) + done, n, t.values.dtype, bits.data());
    write_tensor_bytes(t.values, at + static_cast<size_t>(done) * sizeof(uint16_t), bits.data(), n * sizeof(uint16_t));
  }
}

// One copy from a saved piece's elements (`from`, laid out as op.src_shape, in `dtype`) into
// its target. The rows of a split copy go to the device one contiguous run at a time.
void copy_piece(const CopyOp& op, const uint8_t* from, DType dtype, const FlatPiece& t) {
  const size_t es = dtype_size(dtype);
  const Shape& dst_shape = t.slice.tensor.shape;
  if (op.dim < 0) return write_slice_elements(t, 0, shape_numel(dst_shape), from, dtype);
  int64_t outer = 1, inner = 1;
  for (int d = 0; d < op.dim; ++d) outer *= dst_shape[d];
  for (size_t d = op.dim + 1; d < dst_shape.size(); ++d) inner *= dst_shape[d];
  const int64_t src_rows = op.src_shape[op.dim], dst_rows = dst_shape[op.dim];
  for (int64_t o = 0; o < outer; ++o)
    write_slice_elements(t, (o * dst_rows + op.begin - op.dst_start) * inner, (op.end - op.begin) * inner,
                         from + static_cast<size_t>((o * src_rows + op.begin - op.src_start) * inner) * es, dtype);
}

// Verifies each file that `ops_by_file` copies from, then copies from the file mapped
// (safetensors::Reader::open): a load holds no host copy of a file, only the page cache
// (committed checkpoint files are never rewritten in place), and each tensor's mapped pages
// are dropped once it is copied.
// A piece saved in flat parts is joined in one host buffer of its slice first. Each file is
// verified once, when first read, and stays mapped until the end.
void execute(const PieceIndex& index, const std::vector<FlatPiece>& targets,
             const std::vector<std::vector<CopyOp>>& ops_by_file) {
  std::vector<std::optional<safetensors::Reader>> readers(index.sources().size());
  auto reader = [&](size_t f) -> const safetensors::Reader& {
    if (!readers[f]) {
      const SourceFile& src = index.sources()[f];
      if (!checksum_ok(src)) throw checksum_error(src.path);
      readers[f] = safetensors::Reader::open(src.path);
    }
    return *readers[f];
  };
  // use(bytes) on a saved tensor's bytes; its mapped pages are dropped after (one tensor at a
  // time resident, not whole files).
  auto with_tensor = [&](size_t f, const std::string& name, const Shape& shape, DType dtype, auto&& use) {
    const safetensors::TensorInfo* info = reader(f).find(name);
    if (!info || info->shape != shape || info->dtype != dtype)
      throw runtime_error("checkpoint file " + index.sources()[f].path + " changed while it was being loaded (tensor " +
                          name + ")");
    use(reader(f).bytes(*info));
    reader(f).drop_pages(*info);
  };
  std::vector<float> joined;
  for (size_t f = 0; f < ops_by_file.size(); ++f) {
    for (const CopyOp& op : ops_by_file[f]) {
      const FlatPiece& t = targets[op.target];
      const std::string& name = t.slice.name;
      if (!op.joined) {
        const DType dtype = index.dtype(name);
        with_tensor(f, name, op.src_shape, dtype,
                    [&](std::span<const uint8_t> bytes) { copy_piece(op, bytes.data(), dtype, t); });
        continue;
      }
      joined.resize(static_cast<size_t>(shape_numel(op.joined->shape)));
      for (const FlatPart& part : op.joined->parts)
        with_tensor(part.file, name, {part.end - part.begin}, DType::F32, [&](std::span<const uint8_t> bytes) {
          std::memcpy(joined.data() + part.begin, bytes.data(), bytes.size());
        });
      copy_piece(op, reinterpret_cast<const uint8_t*>(joined.data()), DType::F32, t);
    }
  }
}

json read_metadata_json(const std::string& it_dir) {
  const std::string meta_path = (fs::path(it_dir) / "metadata.json").string();
  if (!fs::exists(meta_path))
    throw runtime_error("checkpoint " + it_dir + " is missing metadata.json",
                        "it was not written by tessera, or the save did not finish");
  try {
    return json::parse(read_file(meta_path));
  } catch (const json::exception& e) {
    throw runtime_error(meta_path + " is not valid JSON: " + e.what());
  }
}

CheckpointState state_from_json(const json& meta) {
  CheckpointState s;
  s.format_version = meta.value("format_version", 1);
  s.iteration = meta.at("iteration").get<int64_t>();
  s.consumed_train_samples = meta.at("consumed_train_samples").get<int64_t>();
  s.consumed_valid_samples = meta.at("consumed_valid_samples").get<int64_t>();
  s.scheduler_num_steps = meta.at("scheduler_num_steps").get<int64_t>();
  s.optimizer_steps = meta.at("optimizer_steps").get<int64_t>();
  s.scheduler = meta.at("scheduler");
  s.args = meta.at("args");
  s.grad_scaler = meta.value("grad_scaler", json());
  s.layout.tensor_parallel = meta.value("tensor_model_parallel_size", 1);
  s.layout.pipeline_parallel = meta.value("pipeline_model_parallel_size", 1);
  s.layout.data_parallel = meta.value("data_parallel_size", 1);
  s.layout.virtual_stages = meta.value("virtual_pipeline_model_parallel_size", 1);
  s.layout.padded_vocab_size = meta.value("padded_vocab_size", int64_t{0});
  s.optimizer_dp_shards = meta.value("optimizer_dp_shards", 0);
  s.main_params_in_optimizer = meta.value("main_params_in_optimizer", false);
  if (s.layout.tensor_parallel < 1 || s.layout.pipeline_parallel < 1 || s.layout.data_parallel < 1 ||
      s.layout.virtual_stages < 1)
    throw runtime_error("records a layout with a size below 1");
  if (s.optimizer_dp_shards < 0 || s.optimizer_dp_shards > 999)
    throw runtime_error("records " + std::to_string(s.optimizer_dp_shards) + " optimizer_dp_shards (0 to 999)");
  return s;
}

// The metadata's files of one kind, checked against the layout.
std::vector<SourceFile> source_files(const json& files, const std::string& it_dir, const char* kind) {
  std::vector<SourceFile> out;
  for (const auto& [rel, info] : files.items()) {
    if (!is_of_kind(fs::path(rel).filename().string(), kind)) continue;
    if (rel.find("..") != std::string::npos || fs::path(rel).is_absolute())
      throw runtime_error(it_dir + "/metadata.json lists a file outside the checkpoint: " + rel);
    out.push_back({rel, (fs::path(it_dir) / rel).string(), info.at("sha256").get<std::string>(),
                   info.at("bytes").get<uint64_t>(), tp_rank_of_shard(shard_of(rel))});
  }
  return out;
}

}  // namespace

void read_tensor_bytes(const Tensor& t, void* dst) {
  copy_to_host(dst, t.bytes(), on_a_device(t));
}

void write_tensor_bytes(const Tensor& t, size_t offset, const void* src, size_t bytes) {
  TESSERA_CHECK(offset + bytes <= t.bytes(), "write_tensor_bytes: bytes [" + std::to_string(offset) + ", " +
                                                 std::to_string(offset + bytes) + ") of a " + shape_str(t.shape) +
                                                 " tensor");
  if (bytes > 0) on_a_device(t).device->copy_from_host(t.handle, t.offset + offset, src, bytes);
}

std::string checkpoint_iteration_dir(const std::string& dir, int64_t iteration) {
  if (iteration == kReleaseIteration) return (fs::path(dir) / "release").string();
  char name[32];
  std::snprintf(name, sizeof(name), "iter_%07lld", static_cast<long long>(iteration));
  return (fs::path(dir) / name).string();
}

std::string checkpoint_shard_folder(int tp_rank, int pp_rank, int pp_size, int ep_rank) {
  char name[32];
  if (ep_rank > 0)
    std::snprintf(name, sizeof(name), "mp_rank_%02d_%03d_%03d", tp_rank, pp_rank, ep_rank);
  else if (pp_size > 1)
    std::snprintf(name, sizeof(name), "mp_rank_%02d_%03d", tp_rank, pp_rank);
  else
    std::snprintf(name, sizeof(name), "mp_rank_%02d", tp_rank);
  return name;
}

std::optional<TensorPlacement> parse_tensor_placement(const std::string& text, const Shape& local) {
  std::optional<Shape> global, offsets;
  std::optional<int> split;
  size_t start = 0;
  while (start <= text.size()) {
    size_t end = text.find(';', start);
    if (end == std::string::npos) end = text.size();
    const std::string item = text.substr(start, end - start);
    const size_t eq = item.find('=');
    if (eq == std::string::npos) return std::nullopt;
    const std::string key = item.substr(0, eq), value = item.substr(eq + 1);
    if (key == "global_shape") {
      global = parse_list(value);
    } else if (key == "offset") {
      offsets = parse_list(value);
    } else if (key == "split_dim") {
      if (value == "-1") split = -1;
      else if (value.size() == 1 && std::isdigit(static_cast<unsigned char>(value[0]))) split = value[0] - '0';
      else return std::nullopt;
    }
    start = end + 1;
  }
  if (!global || !offsets || global->size() != local.size() || offsets->size() != local.size()) return std::nullopt;
  const int rank = static_cast<int>(local.size());
  if (!split) {  // format 1 records no split: the dimension where the piece is not whole
    split = -1;
    for (int d = 0; d < rank && *split < 0; ++d)
      if ((*offsets)[d] != 0 || local[d] != (*global)[d]) split = d;
  }
  if (*split >= rank) return std::nullopt;
  for (int d = 0; d < rank; ++d) {
    if (d == *split) {
      if ((*offsets)[d] > (*global)[d] || local[d] > (*global)[d] - (*offsets)[d]) return std::nullopt;
    } else if ((*offsets)[d] != 0 || local[d] != (*global)[d]) {
      return std::nullopt;
    }
  }
  return TensorPlacement{*global, *split, *split >= 0 ? (*offsets)[*split] : 0};
}

SaveSignalScope::SaveSignalScope() {
  g_save_signal.store(0);
  struct sigaction record {};
  record.sa_handler = record_save_signal;
  sigemptyset(&record.sa_mask);
  // SA_RESTART: the writes, fsyncs and collectives the signal lands in carry on to the next check.
  record.sa_flags = SA_RESETHAND | SA_RESTART;
  for (int i = 0; i < 2; ++i) {
    if (::sigaction(kSaveSignals[i], nullptr, &previous_[i]) != 0 || previous_[i].sa_handler == SIG_IGN) continue;
    installed_[i] = ::sigaction(kSaveSignals[i], &record, nullptr) == 0;
  }
}

SaveSignalScope::~SaveSignalScope() { restore(); }

void SaveSignalScope::restore() {
  for (int i = 0; i < 2; ++i)
    if (installed_[i]) ::sigaction(kSaveSignals[i], &previous_[i], nullptr);
  installed_[0] = installed_[1] = false;
}

int SaveSignalScope::received() const { return g_save_signal.load(); }

void SaveSignalScope::reraise() {
  const int sig = received();
  TESSERA_CHECK(sig != 0, "SaveSignalScope::reraise without a signal");
  restore();
  ::raise(sig);
  std::_Exit(128 + sig);
}

void throw_if_save_interrupted() {
  if (const int sig = g_save_signal.load())
    throw runtime_error("interrupted by " + save_signal_name(sig));
}

std::string save_signal_name(int sig) { return std::string("SIG") + sigabbrev_np(sig); }

std::string checkpoint_temp_dir(const std::string& dir, int64_t iteration, int64_t token) {
  return checkpoint_iteration_dir(dir, iteration) + ".tmp-" + std::to_string(token);
}

std::string prepare_checkpoint_save(const std::string& dir, int64_t iteration, int64_t token) {
  std::error_code ec;
  fs::create_directories(dir, ec);
  if (ec) throw runtime_error("cannot create --save folder " + dir + ": " + ec.message());
  const std::string tmp_dir = checkpoint_temp_dir(dir, iteration, token);
  fs::remove_all(tmp_dir, ec);
  fs::create_directories(tmp_dir, ec);
  if (ec) throw runtime_error("cannot create " + tmp_dir + ": " + ec.message(), "check that --save is writable");
  try {
    ckpt_detail::write_save_owner(tmp_dir);
  } catch (...) {
    abandon_checkpoint_save(tmp_dir);
    throw;
  }
  return tmp_dir;
}

namespace {

fs::path make_shard_folder(const std::string& tmp_dir, const std::string& shard) {
  std::error_code ec;
  const fs::path folder = fs::path(tmp_dir) / shard;
  fs::create_directories(folder, ec);
  if (ec) throw runtime_error("cannot create " + folder.string() + ": " + ec.message(), "check that --save is writable");
  return folder;
}

}  // namespace

std::vector<CheckpointFile> write_checkpoint_shard(const std::string& tmp_dir, const std::string& shard,
                                                   const std::vector<ShardedTensor>& model,
                                                   const std::vector<ShardedTensor>& optimizer,
                                                   FloatStorage model_storage) {
  const fs::path folder = make_shard_folder(tmp_dir, shard);
  std::vector<CheckpointFile> files;
  auto write = [&](const char* file, const std::vector<ShardedTensor>& tensors, FloatStorage storage) {
    std::vector<FileTensor> entries;
    for (const ShardedTensor& t : tensors)
      entries.push_back({t.name, t.tensor, placement_text(t), stored_dtype(t.tensor.dtype, storage)});
    files.push_back(write_tensors_file((folder / file).string(), shard + "/" + file, entries));
  };
  write(kModelFile, model, model_storage);
  if (!optimizer.empty()) write(kOptimizerFile, optimizer, FloatStorage::AsIs);
  fsync_directory(folder.string());
  return files;
}

std::string optimizer_dp_shard_file(int dp_rank) {
  char name[48];
  std::snprintf(name, sizeof name, "%s%03d.safetensors", kOptimizerDpPrefix, dp_rank);
  return name;
}

CheckpointFile write_optimizer_dp_shard(const std::string& tmp_dir, const std::string& shard, int dp_rank,
                                        const std::vector<FlatPiece>& pieces) {
  const fs::path folder = make_shard_folder(tmp_dir, shard);
  std::vector<FileTensor> entries;
  for (const FlatPiece& p : pieces) {
    TESSERA_CHECK(p.values.dtype == DType::F32 && p.values.numel() == p.end - p.begin, "flat piece of " + p.slice.name);
    entries.push_back({p.slice.name, p.values, placement_text(p), DType::F32});
  }
  const std::string file = optimizer_dp_shard_file(dp_rank);
  CheckpointFile written = write_tensors_file((folder / file).string(), shard + "/" + file, entries);
  fsync_directory(folder.string());
  return written;
}

void commit_checkpoint_save(const std::string& dir, const std::string& tmp_dir, const CheckpointState& state,
                            const std::vector<CheckpointFile>& files) {
  json listed = json::object();
  for (const CheckpointFile& f : files) listed[f.path] = {{"sha256", f.sha256}, {"bytes", f.bytes}};
  const CheckpointLayout& l = state.layout;
  json meta = {{"format", "tessera-checkpoint"},
               {"format_version", kFormatVersion},
               {"iteration", state.iteration},
               {"consumed_train_samples", state.consumed_train_samples},
               {"consumed_valid_samples", state.consumed_valid_samples},
               {"scheduler_num_steps", state.scheduler_num_steps},
               {"optimizer_steps", state.optimizer_steps},
               {"scheduler", state.scheduler},
               {"tensor_model_parallel_size", l.tensor_parallel},
               {"pipeline_model_parallel_size", l.pipeline_parallel},
               {"data_parallel_size", l.data_parallel},
               {"virtual_pipeline_model_parallel_size", l.virtual_stages},
               {"padded_vocab_size", l.padded_vocab_size},
               {"optimizer_dp_shards", state.optimizer_dp_shards},
               {"main_params_in_optimizer", state.main_params_in_optimizer},
               {"args", state.args},
               {"files", listed}};
  if (!state.grad_scaler.is_null()) meta["grad_scaler"] = state.grad_scaler;
  write_file_synced((fs::path(tmp_dir) / "metadata.json").string(), meta.dump(2));
  commit_checkpoint_folder(dir, tmp_dir, state.iteration);
}

void commit_checkpoint_folder(const std::string& dir, const std::string& tmp_dir, int64_t iteration) {
  fs::remove(fs::path(tmp_dir) / ckpt_detail::kSaveOwnerFile);
  fsync_directory(tmp_dir);
  // Replace an existing folder of the same iteration only after the new one is complete.
  std::error_code ec;
  const std::string final_dir = checkpoint_iteration_dir(dir, iteration);
  const std::string old_dir = final_dir + ".old-" + std::to_string(::getpid());
  const bool replacing = fs::exists(final_dir);
  if (replacing) fs::rename(final_dir, old_dir, ec);
  if (ec) throw runtime_error("cannot move aside " + final_dir + ": " + ec.message());
  fs::rename(tmp_dir, final_dir, ec);
  if (ec) throw runtime_error("cannot rename " + tmp_dir + " to " + final_dir + ": " + ec.message());
  fsync_directory(dir);
  write_file_atomic((fs::path(dir) / kTracker).string(), std::to_string(iteration));
  if (replacing) fs::remove_all(old_dir, ec);
}

void save_checkpoint(const std::string& dir, const CheckpointState& state, const std::vector<NamedTensor>& model,
                     const std::vector<NamedTensor>& optimizer) {
  auto whole = [](const std::vector<NamedTensor>& in) {
    std::vector<ShardedTensor> out;
    for (const NamedTensor& t : in) out.push_back({t.name, t.tensor, t.tensor.shape, -1, 0});
    return out;
  };
  const std::string tmp_dir = prepare_checkpoint_save(dir, state.iteration, ::getpid());
  try {
    const std::vector<CheckpointFile> files = write_checkpoint_shard(
        tmp_dir, checkpoint_shard_folder(0, 0, state.layout.pipeline_parallel), whole(model), whole(optimizer));
    commit_checkpoint_save(dir, tmp_dir, state, files);
  } catch (...) {
    abandon_checkpoint_save(tmp_dir);
    throw;
  }
}

std::optional<int64_t> latest_checkpoint_iteration(const std::string& dir) {
  const std::string tracker = (fs::path(dir) / kTracker).string();
  if (!fs::exists(tracker)) return std::nullopt;
  const std::string text = read_file(tracker);
  // Megatron strips the tracker's whitespace before comparing it with "release".
  const size_t first = text.find_first_not_of(" \t\r\n"), last = text.find_last_not_of(" \t\r\n");
  if (first != std::string::npos && text.substr(first, last - first + 1) == "release") return kReleaseIteration;
  char* end = nullptr;
  const long long iteration = std::strtoll(text.c_str(), &end, 10);
  if (text.empty() || (*end && !std::isspace(static_cast<unsigned char>(*end))) || iteration < 0)
    throw runtime_error(tracker + " does not hold an iteration number (it holds '" + text.substr(0, 40) + "')",
                        "fix or delete the tracker file");
  return iteration;
}

CheckpointState read_checkpoint_metadata(const std::string& dir, int64_t iteration) {
  if (is_megatron_checkpoint(dir, iteration)) return read_megatron_metadata(dir, iteration);
  if (is_torch_dist_checkpoint(dir, iteration)) return read_torch_dist_metadata(dir, iteration);
  const std::string it_dir = checkpoint_iteration_dir(dir, iteration);
  const json meta = read_metadata_json(it_dir);
  try {
    return state_from_json(meta);
  } catch (const json::exception& e) {
    throw runtime_error(it_dir + "/metadata.json lacks a field or has a wrong type: " + e.what());
  } catch (const Error& e) {
    throw runtime_error(it_dir + "/metadata.json " + e.what());
  }
}

std::vector<FlatPiece> whole_pieces(const std::vector<ShardedTensor>& slices) {
  std::vector<FlatPiece> out;
  for (const ShardedTensor& t : slices) out.push_back({t, 0, t.tensor.numel(), t.tensor});
  return out;
}

CheckpointState load_checkpoint(const std::string& dir, int64_t iteration, const std::vector<ShardedTensor>& model,
                                const std::vector<ShardedTensor>& optimizer, bool load_optimizer, int tp_rank,
                                int tp_size) {
  return load_checkpoint_pieces(dir, iteration, whole_pieces(model), whole_pieces(optimizer), load_optimizer, tp_rank,
                                tp_size);
}

CheckpointState load_checkpoint_pieces(const std::string& dir, int64_t iteration, const std::vector<FlatPiece>& model,
                                       const std::vector<FlatPiece>& optimizer, bool load_optimizer, int tp_rank,
                                       int tp_size) {
  if (is_megatron_checkpoint(dir, iteration))
    return load_megatron_checkpoint(dir, iteration, model, optimizer, load_optimizer, tp_rank, tp_size);
  if (is_torch_dist_checkpoint(dir, iteration))
    return load_torch_dist_checkpoint(dir, iteration, model, optimizer, load_optimizer, tp_rank, tp_size);
  const std::string it_dir = checkpoint_iteration_dir(dir, iteration);
  const json meta = read_metadata_json(it_dir);
  CheckpointState s;
  std::vector<SourceFile> model_files, optimizer_files;
  try {
    s = state_from_json(meta);
    const json& files = meta.at("files");
    model_files = source_files(files, it_dir, kModelFile);
    optimizer_files = source_files(files, it_dir, kOptimizerFile);
  } catch (const json::exception& e) {
    throw runtime_error(it_dir + "/metadata.json lacks a field or has a wrong type: " + e.what());
  }
  if (s.iteration != iteration)
    throw runtime_error(it_dir + "/metadata.json records iteration " + std::to_string(s.iteration),
                        "the folder was renamed or copied; restore its name iter_" + std::to_string(s.iteration));
  // Every (tp, pp) shard of the saved layout must be listed.
  for (int pp = 0; pp < s.layout.pipeline_parallel; ++pp)
    for (int tp = 0; tp < s.layout.tensor_parallel; ++tp) {
      const std::string shard = checkpoint_shard_folder(tp, pp, s.layout.pipeline_parallel);
      if (!std::any_of(model_files.begin(), model_files.end(),
                       [&](const SourceFile& f) { return shard_of(f.rel) == shard; }))
        throw runtime_error(it_dir + "/metadata.json lists no file of shard " + shard + " (tensor-parallel rank " +
                            std::to_string(tp) + ", pipeline rank " + std::to_string(pp) + ")");
    }
  // With the distributed optimizer's files, every data-parallel rank's of every shard.
  for (int pp = 0; load_optimizer && pp < s.layout.pipeline_parallel; ++pp)
    for (int tp = 0; tp < s.layout.tensor_parallel; ++tp)
      for (int r = 0; r < s.optimizer_dp_shards; ++r) {
        const std::string rel = checkpoint_shard_folder(tp, pp, s.layout.pipeline_parallel) + "/" +
                                optimizer_dp_shard_file(r);
        if (!std::any_of(optimizer_files.begin(), optimizer_files.end(), [&](const SourceFile& f) { return f.rel == rel; }))
          throw runtime_error(it_dir + "/metadata.json does not list " + rel + ", the optimizer state of data-parallel "
                              "rank " + std::to_string(r) + " of " + std::to_string(s.optimizer_dp_shards),
                              "the save did not finish or metadata.json was edited; load an earlier iteration, or "
                              "pass --no-load-optim to load the model alone");
      }
  if (load_optimizer && optimizer_files.empty())
    throw runtime_error("checkpoint " + it_dir + " has no optimizer state (saved with --no-save-optim)",
                        "pass --no-load-optim or --finetune");
  if (load_optimizer && s.format_version < 2)
    throw runtime_error("checkpoint " + it_dir + " is of format version " + std::to_string(s.format_version) +
                            ", whose optimizer state is named by parameter index",
                        "load its model with --no-load-optim or --finetune");

  // The saved TP rank whose slice holds this rank's (when the sizes divide), read first.
  const int preferred = static_cast<int>(static_cast<int64_t>(tp_rank) * s.layout.tensor_parallel / tp_size);
  // Planning trusts the headers only to locate tensors; when it fails, a damaged file is the
  // likelier cause, and is reported as such.
  auto planned = [&](const std::vector<SourceFile>& sources, auto&& plan) {
    try {
      return plan();
    } catch (const Error&) {
      for (const SourceFile& src : sources)
        if (fs::exists(src.path) && !checksum_ok(src)) throw checksum_error(src.path);
      throw;
    }
  };
  std::optional<PieceIndex> model_index, optimizer_index;
  std::vector<std::vector<CopyOp>> model_ops(model_files.size()), optimizer_ops(optimizer_files.size());
  planned(model_files, [&] {
    model_index.emplace(it_dir, model_files);
    for (size_t i = 0; i < model.size(); ++i) model_index->plan(model[i], i, preferred, "parameter", model_ops);
  });
  if (load_optimizer)
    planned(optimizer_files, [&] {
      optimizer_index.emplace(it_dir, optimizer_files);
      for (size_t i = 0; i < optimizer.size(); ++i)
        optimizer_index->plan(optimizer[i], i, preferred, "optimizer state", optimizer_ops);
    });
  execute(*model_index, model, model_ops);
  if (load_optimizer) execute(*optimizer_index, optimizer, optimizer_ops);
  return s;
}

void load_external_pieces(const std::string& it_dir, const std::vector<ExternalSource>& sources,
                          const std::vector<ExternalPiece>& pieces, const std::vector<FlatPiece>& targets,
                          int preferred_tp_rank, const char* what,
                          const std::function<std::vector<float>(size_t)>& read) {
  std::vector<SourceFile> files;
  for (const ExternalSource& src : sources) files.push_back({src.path, src.path, "", 0, src.tp_rank});
  PieceIndex index(it_dir, std::move(files), pieces);
  std::vector<std::vector<CopyOp>> ops(sources.size());
  for (size_t i = 0; i < targets.size(); ++i) index.plan(targets[i], i, preferred_tp_rank, what, ops);
  for (const std::vector<CopyOp>& file_ops : ops)
    for (const CopyOp& op : file_ops) {
      const std::vector<float> values = read(op.piece);
      copy_piece(op, reinterpret_cast<const uint8_t*>(values.data()), DType::F32, targets[op.target]);
    }
}

CheckpointState load_checkpoint(const std::string& dir, int64_t iteration, const std::vector<NamedTensor>& model,
                                const std::vector<NamedTensor>& optimizer, bool load_optimizer) {
  auto whole = [](const std::vector<NamedTensor>& in) {
    std::vector<ShardedTensor> out;
    for (const NamedTensor& t : in) out.push_back({t.name, t.tensor, t.tensor.shape, -1, 0});
    return out;
  };
  return load_checkpoint(dir, iteration, whole(model), whole(optimizer), load_optimizer);
}

}  // namespace tessera
