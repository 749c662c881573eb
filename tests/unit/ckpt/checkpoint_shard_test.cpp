// Sharded checkpoints without processes: several "ranks" of one layout write their shards
// through the save steps (prepare, write_checkpoint_shard, commit), and every slice of other
// layouts loads the right elements (row splits, column splits, replicated tensors, slices
// that straddle saved pieces, whole tensors, flat pieces of slices, 16-bit tensors widened on
// save and rounded on load); the placement record's parser; and the errors
// that name the file, tensor or shard; tensors on devices that are not host memory.
#include <gtest/gtest.h>
#include <unistd.h>

#include <filesystem>
#include <fstream>
#include <nlohmann/json.hpp>
#include <array>
#include <numeric>

#include "tessera/ckpt/checkpoint.h"
#include "tessera/ckpt/megatron_checkpoint.h"
#include "tessera/core/error.h"
#include "tessera/device/registry.h"

namespace fs = std::filesystem;
using tessera::CheckpointFile;
using tessera::CheckpointState;
using tessera::DType;
using tessera::Shape;
using tessera::ShardedTensor;
using tessera::Tensor;

namespace {

// Global tensors: "rows" [8, 3] split along dim 0, "cols" [2, 12] split along dim 1, "norm"
// [5] whole on every TP rank. Element values are their flat global index.
struct Global {
  std::string name;
  Shape shape;
  int split;
};
const std::vector<Global> kGlobals = {{"rows", {8, 3}, 0}, {"cols", {2, 12}, 1}, {"norm", {5}, -1}};

float value_at(const Global& g, const Shape& index) {
  int64_t flat = 0;
  for (size_t d = 0; d < g.shape.size(); ++d) flat = flat * g.shape[d] + index[d];
  return static_cast<float>(flat) + (g.name == "cols" ? 1000.0f : g.name == "norm" ? 2000.0f : 0.0f);
}

// A slice [offset, offset + length) of g along its split (whole when split < 0), owning its data.
struct Slice {
  std::vector<float> data;
  ShardedTensor t;
};

Slice make_slice(const Global& g, int64_t offset, int64_t length, bool fill, const std::string& prefix = "") {
  Slice s;
  Shape local = g.shape;
  if (g.split >= 0) local[g.split] = length;
  s.data.assign(static_cast<size_t>(tessera::shape_numel(local)), -1.0f);
  if (fill) {
    for (int64_t i = 0; i < local[0]; ++i)
      for (int64_t j = 0; j < (local.size() > 1 ? local[1] : 1); ++j) {
        Shape index = local.size() > 1 ? Shape{i, j} : Shape{i};
        Shape global_index = index;
        if (g.split >= 0) global_index[g.split] += offset;
        s.data[i * (local.size() > 1 ? local[1] : 1) + j] = value_at(g, global_index);
      }
  }
  s.t = {prefix + g.name, Tensor(s.data.data(), DType::F32, local, nullptr), g.shape, g.split,
         g.split >= 0 ? offset : 0};
  return s;
}

// A slice moved onto a device: its tensor points into `buffer`; read_back() refreshes the
// slice's host data from it.
struct DeviceCopy {
  tessera::Buffer buffer;
  Slice* slice;
  void read_back() const {
    tessera::copy_to_host(slice->data.data(), slice->data.size() * sizeof(float), slice->t.tensor);
  }
};

DeviceCopy to_device(tessera::Device& device, Slice& s) {
  DeviceCopy c{tessera::Buffer(device, s.data.size() * sizeof(float)), &s};
  s.t.tensor = tessera::tensor_at(c.buffer, 0, DType::F32, s.t.tensor.shape);
  tessera::copy_from_host(s.t.tensor, s.data.data(), s.data.size() * sizeof(float));
  return c;
}

void expect_slice(const Slice& s, const Global& g, int64_t offset) {
  const Slice want = make_slice(g, offset, s.t.tensor.shape[g.split >= 0 ? g.split : 0], true);
  EXPECT_EQ(s.data, want.data) << g.name << " at " << offset;
}

class CheckpointShardTest : public ::testing::Test {
 protected:
  void SetUp() override {
    dir_ = fs::path(TESSERA_BINARY_DIR) / "Testing" / "tmp" /
           ("checkpoint_shard_test_" + std::to_string(getpid()) + "_" +
            ::testing::UnitTest::GetInstance()->current_test_info()->name());
    fs::remove_all(dir_);
    fs::create_directories(dir_);
  }
  void TearDown() override {
    if (!HasFailure()) fs::remove_all(dir_);
  }

  // Saves iteration `iteration` as TP `tp` (PP 1) into dir_/`folder`: each TP rank writes its
  // shard, with optimizer state "exp_avg.<name>" holding the same values; the tensors live on
  // `device` when given.
  std::string save(int tp, int64_t iteration = 5, tessera::Device* device = nullptr,
                   const std::string& folder = "ckpt") {
    const std::string dir = (dir_ / folder).string();
    const std::string tmp = tessera::prepare_checkpoint_save(dir, iteration, 4242);
    std::vector<CheckpointFile> files;
    for (int r = 0; r < tp; ++r) {
      std::vector<Slice> model, optimizer;
      for (const Global& g : kGlobals) {
        const int64_t len = g.split >= 0 ? g.shape[g.split] / tp : 0;
        model.push_back(make_slice(g, r * len, len, true));
        optimizer.push_back(make_slice(g, r * len, len, true, "exp_avg."));
      }
      std::vector<DeviceCopy> on_device;
      if (device)
        for (auto* slices : {&model, &optimizer})
          for (Slice& s : *slices) on_device.push_back(to_device(*device, s));
      std::vector<ShardedTensor> m, o;
      for (auto& s : model) m.push_back(s.t);
      for (auto& s : optimizer) o.push_back(s.t);
      for (auto& f : tessera::write_checkpoint_shard(tmp, tessera::checkpoint_shard_folder(r, 0, 1), m, o))
        files.push_back(f);
    }
    CheckpointState state;
    state.iteration = iteration;
    state.consumed_train_samples = 40;
    state.args = nlohmann::json::array({"--num-layers", "1"});
    state.layout = {tp, 1, 3, 1, 64};
    tessera::commit_checkpoint_save(dir, tmp, state, files);
    return dir;
  }

  // Saves iteration 5 as TP `tp` with the distributed optimizer's state: each TP rank's
  // model file, and "exp_avg.<name>" cut into flat pieces over `dp` data-parallel files, rank
  // d holding elements [d·n/dp, (d+1)·n/dp) of each n-element slice (some pieces empty).
  // `listed_dp_files` of them are listed in metadata.json.
  std::string save_dp_sharded(int tp, int dp, int listed_dp_files) {
    const std::string dir = (dir_ / "sharded").string();
    const std::string tmp = tessera::prepare_checkpoint_save(dir, 5, 4242);
    std::vector<CheckpointFile> files;
    for (int r = 0; r < tp; ++r) {
      std::vector<Slice> model, state;
      for (const Global& g : kGlobals) {
        const int64_t len = g.split >= 0 ? g.shape[g.split] / tp : 0;
        model.push_back(make_slice(g, r * len, len, true));
        state.push_back(make_slice(g, r * len, len, true, "exp_avg."));
      }
      std::vector<ShardedTensor> m;
      for (auto& sl : model) m.push_back(sl.t);
      const std::string shard = tessera::checkpoint_shard_folder(r, 0, 1);
      for (auto& f : tessera::write_checkpoint_shard(tmp, shard, m, {})) files.push_back(f);
      for (int d = 0; d < dp; ++d) {
        std::vector<tessera::FlatPiece> pieces;
        for (Slice& sl : state) {
          const int64_t n = tessera::shape_numel(sl.t.tensor.shape), begin = d * n / dp, end = (d + 1) * n / dp;
          pieces.push_back({sl.t, begin, end, Tensor(sl.data.data() + begin, DType::F32, {end - begin}, nullptr)});
        }
        const CheckpointFile f = tessera::write_optimizer_dp_shard(tmp, shard, d, pieces);
        if (d < listed_dp_files) files.push_back(f);
      }
    }
    CheckpointState state;
    state.iteration = 5;
    state.args = nlohmann::json::array({"--num-layers", "1"});
    state.layout = {tp, 1, dp, 1, 64};
    state.optimizer_dp_shards = dp;
    tessera::commit_checkpoint_save(dir, tmp, state, files);
    return dir;
  }

  fs::path dir_;
};

TEST_F(CheckpointShardTest, EverySliceOfAnotherLayoutLoads) {
  const std::string dir = save(4);
  EXPECT_EQ(*tessera::latest_checkpoint_iteration(dir), 5);
  EXPECT_TRUE(fs::exists(dir + "/iter_0000005/mp_rank_03/optimizer.safetensors"));
  // TP 2's halves, TP 1's whole, and odd slices that straddle the saved pieces:
  // (rows offset, rows length, cols offset, cols length).
  for (auto [ro, rl, co, cl] : std::vector<std::array<int64_t, 4>>{{0, 4, 0, 6}, {4, 4, 6, 6}, {0, 8, 0, 12},
                                                                     {1, 6, 5, 6}, {7, 1, 2, 1}}) {
    std::vector<Slice> model, optimizer;
    for (const Global& g : kGlobals) {
      const int64_t off = g.name == "rows" ? ro : g.name == "cols" ? co : 0;
      const int64_t len = g.name == "rows" ? rl : g.name == "cols" ? cl : 0;
      model.push_back(make_slice(g, off, len, false));
      optimizer.push_back(make_slice(g, off, len, false, "exp_avg."));
    }
    std::vector<ShardedTensor> m, o;
    for (auto& s : model) m.push_back(s.t);
    for (auto& s : optimizer) o.push_back(s.t);
    CheckpointState s = tessera::load_checkpoint(dir, 5, m, o, true, 1, 2);
    EXPECT_EQ(s.consumed_train_samples, 40);
    EXPECT_EQ(s.layout.tensor_parallel, 4);
    EXPECT_EQ(s.layout.data_parallel, 3);
    EXPECT_EQ(s.layout.padded_vocab_size, 64);
    EXPECT_EQ(s.format_version, 2);
    for (size_t i = 0; i < kGlobals.size(); ++i) {
      expect_slice(model[i], kGlobals[i], m[i].offset);
      expect_slice(optimizer[i], kGlobals[i], o[i].offset);
    }
  }
  // Whole tensors (the tools' overload).
  std::vector<std::vector<float>> whole;
  std::vector<tessera::NamedTensor> named;
  for (const Global& g : kGlobals) whole.emplace_back(tessera::shape_numel(g.shape), -1.0f);
  for (size_t i = 0; i < kGlobals.size(); ++i)
    named.push_back({kGlobals[i].name, Tensor(whole[i].data(), DType::F32, kGlobals[i].shape, nullptr)});
  tessera::load_checkpoint(dir, 5, named, {}, false);
  for (size_t i = 0; i < kGlobals.size(); ++i) {
    Global g = kGlobals[i];
    const Slice want = make_slice(g, 0, g.split >= 0 ? g.shape[g.split] : 0, true);
    EXPECT_EQ(whole[i], want.data) << g.name;
  }
}

// The distributed optimizer's flat pieces, saved at TP 2 over 3 data-parallel files, join
// into their slices and reshard into every slice of other layouts; a data-parallel file
// missing on disk, or not listed in metadata.json, is an error naming it.
TEST_F(CheckpointShardTest, DataParallelShardsJoinAndReshard) {
  const std::string dir = save_dp_sharded(2, 3, 3);
  EXPECT_TRUE(fs::exists(dir + "/iter_0000005/mp_rank_01/optimizer_dp_002.safetensors"));
  EXPECT_FALSE(fs::exists(dir + "/iter_0000005/mp_rank_01/optimizer.safetensors"));
  EXPECT_EQ(tessera::read_checkpoint_metadata(dir, 5).optimizer_dp_shards, 3);
  for (auto [ro, rl, co, cl] : std::vector<std::array<int64_t, 4>>{{0, 8, 0, 12}, {1, 6, 5, 6}, {6, 2, 9, 3}}) {
    std::vector<Slice> model, optimizer;
    for (const Global& g : kGlobals) {
      const int64_t off = g.name == "rows" ? ro : g.name == "cols" ? co : 0;
      const int64_t len = g.name == "rows" ? rl : g.name == "cols" ? cl : 0;
      model.push_back(make_slice(g, off, len, false));
      optimizer.push_back(make_slice(g, off, len, false, "exp_avg."));
    }
    std::vector<ShardedTensor> m, o;
    for (auto& sl : model) m.push_back(sl.t);
    for (auto& sl : optimizer) o.push_back(sl.t);
    tessera::load_checkpoint(dir, 5, m, o, true, 0, 1);
    for (size_t i = 0; i < kGlobals.size(); ++i) expect_slice(optimizer[i], kGlobals[i], o[i].offset);
  }
  Slice rows = make_slice(kGlobals[0], 0, 8, false), state = make_slice(kGlobals[0], 0, 8, false, "exp_avg.");
  auto error = [&](const std::string& at) {
    try {
      tessera::load_checkpoint(at, 5, {rows.t}, {state.t}, true, 0, 1);
    } catch (const tessera::Error& e) {
      return std::string(e.what());
    }
    return std::string("(no error)");
  };
  fs::remove(dir + "/iter_0000005/mp_rank_01/optimizer_dp_001.safetensors");
  EXPECT_NE(error(dir).find("mp_rank_01/optimizer_dp_001.safetensors is missing"), std::string::npos) << error(dir);
  // Without the optimizer the model loads (and no optimizer file is needed).
  EXPECT_NO_THROW(tessera::load_checkpoint(dir, 5, {rows.t}, {}, false, 0, 1));
  fs::remove_all(dir);
  const std::string unlisted = save_dp_sharded(2, 3, 2);
  EXPECT_NE(error(unlisted).find("does not list mp_rank_00/optimizer_dp_002.safetensors"), std::string::npos)
      << error(unlisted);
}

std::string file_bytes(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  return {std::istreambuf_iterator<char>(in), {}};
}

// Tensors on devices that are not host memory (the strict test device, which refuses host
// access, and every OpenCL device of the build) go through the device's copies: the files
// are byte for byte those of host tensors, and slices that straddle saved pieces, split
// along rows and columns, load back.
TEST_F(CheckpointShardTest, DeviceTensorsSaveTheSameBytesAndLoad) {
  std::vector<std::string> specs = {"strict"};
  for (int i = 0; i < tessera::device_count("opencl"); ++i) specs.push_back("opencl:" + std::to_string(i));
  const std::string host_dir = save(2);
  for (const std::string& spec : specs) {
    tessera::Device& device = tessera::open_device(spec);
    const std::string dir = save(2, 5, &device, spec);
    for (const char* file : {"mp_rank_00/model.safetensors", "mp_rank_01/optimizer.safetensors"})
      EXPECT_EQ(file_bytes(dir + "/iter_0000005/" + file), file_bytes(host_dir + "/iter_0000005/" + file))
          << spec << " " << file;
    std::vector<Slice> model = {make_slice(kGlobals[0], 1, 6, false), make_slice(kGlobals[1], 5, 6, false),
                                make_slice(kGlobals[2], 0, 0, false)};
    std::vector<DeviceCopy> on_device;
    std::vector<ShardedTensor> m;
    for (Slice& s : model) on_device.push_back(to_device(device, s));
    for (Slice& s : model) m.push_back(s.t);
    tessera::load_checkpoint(dir, 5, m, {}, false, 0, 1);
    for (size_t i = 0; i < model.size(); ++i) {
      on_device[i].read_back();
      expect_slice(model[i], kGlobals[i], m[i].offset);
    }
  }
}

// Flat pieces of slices (the distributed optimizer's owned ranges) load only their elements,
// from whole saved pieces (TP 4) and from data-parallel files (TP 2 over 3 files), for slices
// of another layout; the elements outside a piece's range are never written.
TEST_F(CheckpointShardTest, FlatPiecesLoadOnlyTheirElements) {
  for (const std::string& dir : {save(4), save_dp_sharded(2, 3, 3)}) {
    std::vector<Slice> slices;  // TP 2's rank 1 slices, as the wanted values
    std::vector<std::vector<float>> values;
    std::vector<tessera::FlatPiece> pieces;
    for (const Global& g : kGlobals) slices.push_back(make_slice(g, g.split >= 0 ? g.shape[g.split] / 2 : 0,
                                                                 g.split >= 0 ? g.shape[g.split] / 2 : 0, true,
                                                                 "exp_avg."));
    for (Slice& sl : slices) {
      const int64_t n = tessera::shape_numel(sl.t.tensor.shape), begin = 1, end = n - 2;
      values.emplace_back(static_cast<size_t>(end - begin), -1.0f);
      pieces.push_back({sl.t, begin, end, Tensor(values.back().data(), DType::F32, {end - begin}, nullptr)});
    }
    tessera::load_checkpoint_pieces(dir, 5, {}, pieces, true, 1, 2);
    for (size_t i = 0; i < slices.size(); ++i)
      EXPECT_EQ(values[i], std::vector<float>(slices[i].data.begin() + 1, slices[i].data.end() - 2))
          << dir << " " << kGlobals[i].name;
  }
}

// A 16-bit target loads from f32 values rounded to nearest even, and a 16-bit tensor saved
// with FloatStorage::WidenToF32 is an F32 tensor of the file holding its exact values.
TEST_F(CheckpointShardTest, SixteenBitTensorsWidenOnSaveAndRoundOnLoad) {
  const std::string dir = save(2);
  const Global& cols = kGlobals[1];  // 1000..1023: bf16 keeps every fourth
  const Slice saved = make_slice(cols, 0, 12, true);
  std::vector<uint16_t> bf16(saved.data.size());
  tessera::FlatPiece whole{saved.t, 0, static_cast<int64_t>(bf16.size()),
                           Tensor(bf16.data(), DType::BF16, saved.t.tensor.shape, nullptr)};
  tessera::load_checkpoint_pieces(dir, 5, {whole}, {}, false);
  int rounded = 0;
  for (size_t i = 0; i < bf16.size(); ++i) {
    EXPECT_EQ(bf16[i], tessera::f32_to_bf16(saved.data[i])) << i;
    rounded += tessera::bf16_to_f32(bf16[i]) != saved.data[i];
  }
  EXPECT_GT(rounded, 0);
  // The rounded values saved widened read back as F32, exactly.
  const std::string widened = (dir_ / "widened").string();
  const std::string tmp = tessera::prepare_checkpoint_save(widened, 5, 4242);
  ShardedTensor t = saved.t;
  t.tensor = whole.values;
  const std::vector<CheckpointFile> files =
      tessera::write_checkpoint_shard(tmp, "mp_rank_00", {t}, {}, tessera::FloatStorage::WidenToF32);
  CheckpointState state;
  state.iteration = 5;
  state.args = nlohmann::json::array();
  tessera::commit_checkpoint_save(widened, tmp, state, files);
  Slice back = make_slice(cols, 0, 12, false);
  tessera::load_checkpoint(widened, 5, {back.t}, {}, false);
  for (size_t i = 0; i < bf16.size(); ++i) EXPECT_EQ(back.data[i], tessera::bf16_to_f32(bf16[i])) << i;
}

TEST_F(CheckpointShardTest, ASaveOfTheSameIterationReplacesTheOldFolder) {
  save(2);
  const std::string dir = save(4);
  EXPECT_TRUE(fs::exists(dir + "/iter_0000005/mp_rank_03/model.safetensors"));
  EXPECT_EQ(tessera::read_checkpoint_metadata(dir, 5).layout.tensor_parallel, 4);
  for (const auto& e : fs::directory_iterator(dir))
    EXPECT_EQ(e.path().filename().string().find(".old-"), std::string::npos) << e.path();
}

std::string load_error(const std::string& dir, const std::vector<ShardedTensor>& m, bool optimizer = false) {
  try {
    tessera::load_checkpoint(dir, 5, m, {}, optimizer);
  } catch (const tessera::Error& e) {
    return e.what();
  }
  return "(no error)";
}

TEST_F(CheckpointShardTest, ErrorsNameTheFileTensorOrShard) {
  const std::string dir = save(2);
  Slice rows = make_slice(kGlobals[0], 0, 4, false);
  // A tensor the checkpoint lacks.
  Slice other = rows;
  other.t.name = "decoder.layers.9.mlp.linear_fc1.weight";
  other.t.tensor.handle = other.data.data();
  EXPECT_NE(load_error(dir, {other.t}).find("lacks parameter decoder.layers.9.mlp.linear_fc1.weight"),
            std::string::npos);
  // Another global shape: the file, the tensor and both shapes.
  Slice wide = make_slice({"rows", {8, 4}, 0}, 0, 4, false);
  const std::string e = load_error(dir, {wide.t});
  EXPECT_NE(e.find("mp_rank_0"), std::string::npos) << e;
  EXPECT_NE(e.find("tensor rows is F32 [8, 3], the model expects F32 [8, 4]"), std::string::npos) << e;
  // A deleted shard folder.
  fs::rename(dir + "/iter_0000005/mp_rank_01", dir_ / "moved");
  const std::string missing = load_error(dir, {rows.t});
  EXPECT_NE(missing.find("iter_0000005/mp_rank_01/model.safetensors is missing"), std::string::npos) << missing;
  fs::rename(dir_ / "moved", dir + "/iter_0000005/mp_rank_01");
  // A flipped byte in the data of the file the slice needs.
  const std::string file = dir + "/iter_0000005/mp_rank_00/model.safetensors";
  std::string bytes;
  {
    std::ifstream in(file, std::ios::binary);
    bytes.assign(std::istreambuf_iterator<char>(in), {});
  }
  bytes[bytes.size() - 3] ^= 0x5a;
  std::ofstream(file, std::ios::binary) << bytes;
  const std::string corrupt = load_error(dir, {rows.t});
  EXPECT_NE(corrupt.find(file + " is corrupt or truncated (checksum mismatch)"), std::string::npos) << corrupt;
  // The slice held only by the intact file still loads (only files copied from are read).
  Slice upper = make_slice(kGlobals[0], 4, 4, false);
  tessera::load_checkpoint(dir, 5, {upper.t}, {}, false, 1, 2);
  expect_slice(upper, kGlobals[0], 4);
  // A layout whose shard metadata.json does not list.
  nlohmann::json meta = nlohmann::json::parse(std::ifstream(dir + "/iter_0000005/metadata.json"));
  meta["tensor_model_parallel_size"] = 3;
  std::ofstream(dir + "/iter_0000005/metadata.json") << meta.dump();
  EXPECT_NE(load_error(dir, {upper.t}).find("lists no file of shard mp_rank_02"), std::string::npos);
}

TEST_F(CheckpointShardTest, ADamagedHeaderIsAChecksumError) {
  const std::string dir = save(2);
  const std::string file = dir + "/iter_0000005/mp_rank_01/model.safetensors";
  for (size_t at : {12, 30, 60, 100}) {
    std::string bytes;
    {
      std::ifstream in(file, std::ios::binary);
      bytes.assign(std::istreambuf_iterator<char>(in), {});
    }
    const std::string good = bytes;
    bytes[at] ^= 0x21;
    std::ofstream(file, std::ios::binary) << bytes;
    Slice rows = make_slice(kGlobals[0], 0, 8, false);
    const std::string e = load_error(dir, {rows.t});
    EXPECT_NE(e.find(file + " is corrupt or truncated (checksum mismatch)"), std::string::npos) << at << ": " << e;
    std::ofstream(file, std::ios::binary) << good;
  }
}

TEST(CheckpointPlacement, ParsesAndRejects) {
  using tessera::parse_tensor_placement;
  auto p = parse_tensor_placement("global_shape=[64, 32];split_dim=0;offset=[32, 0]", {32, 32});
  ASSERT_TRUE(p);
  EXPECT_EQ(p->global_shape, (Shape{64, 32}));
  EXPECT_EQ(p->split_dim, 0);
  EXPECT_EQ(p->offset, 32);
  // Format 1 (no split_dim): a whole tensor.
  p = parse_tensor_placement("global_shape=[64, 32];offset=[0, 0]", {64, 32});
  ASSERT_TRUE(p);
  EXPECT_EQ(p->split_dim, -1);
  // Inconsistent or malformed records.
  for (const char* bad : {"global_shape=[64, 32];split_dim=0;offset=[40, 0]",  // past the end
                          "global_shape=[64, 32];split_dim=1;offset=[32, 0]",  // offset on a whole dim
                          "global_shape=[64, 33];split_dim=0;offset=[32, 0]",  // other dim differs
                          "global_shape=[64];split_dim=0;offset=[32]",          // rank differs
                          "global_shape=[64, 32];split_dim=7;offset=[32, 0]", "global_shape=[-1, 32];offset=[0, 0]",
                          "global_shape=[64, 32]", "garbage", "", "global_shape=[64,, 32];offset=[0, 0]",
                          "global_shape=[99999999999999999999, 32];offset=[0, 0]"})
    EXPECT_FALSE(parse_tensor_placement(bad, {32, 32})) << bad;
}

TEST(CheckpointNames, MegatronFolders) {
  EXPECT_EQ(tessera::checkpoint_shard_folder(1, 0, 1), "mp_rank_01");
  EXPECT_EQ(tessera::checkpoint_shard_folder(1, 0, 2), "mp_rank_01_000");
  EXPECT_EQ(tessera::checkpoint_shard_folder(3, 12, 16), "mp_rank_03_012");
  // Megatron's expert parallelism (get_checkpoint_name, core_r0.10.0): the EP rank last, only
  // when EP > 1.
  EXPECT_EQ(tessera::megatron_shard_folder(1, 0, 1, 3, 4), "mp_rank_01_003");
  EXPECT_EQ(tessera::megatron_shard_folder(1, 2, 4, 3, 4), "mp_rank_01_002_003");
  EXPECT_EQ(tessera::megatron_shard_folder(1, 2, 4, 0, 1), "mp_rank_01_002");
  EXPECT_EQ(tessera::checkpoint_iteration_dir("d", 100), "d/iter_0000100");
}

}  // namespace
