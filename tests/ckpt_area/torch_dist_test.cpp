// Megatron's torch_dist checkpoints against megatron-core 0.10.0 itself
// (tests/reference/megatron_dist_checkpoint.py in the tdist venv: torch 2.5.1 on the CPU, gloo):
//   - Reading: megatron-core saves a tiny GPT and a tiny Llama (4 layers, random weights, one step
//     of Megatron's optimizer) from TP=2 x PP=2 in four processes with dist_checkpointing.save;
//     megatron-core loads them back at TP=1 PP=1 (dist_checkpointing.load, its own resharding)
//     and dumps every parameter and Adam moment. tessera's load of the same files gives every one
//     of them bit for bit, and the state common.pt records (iteration, consumed samples, scheduler
//     steps, Adam's step); `tessera ckpt inspect` reads every chunk, and `ckpt convert --to
//     tessera` gives the same weights. The same with Megatron's DistributedOptimizer at TP=2 x
//     DP=2 (its default fully_sharded_model_space layout) against the saving optimizer's values.
//   - Writing: tessera's saves load into megatron-core at another layout, plain and distributed
//     optimizer; rng_state and rerun_state_machine objects load where Megatron asks for them.
//   - Megatron's run continues in tessera and is handed back; --ckpt-convert-format converts.
//   - MoE (megatron_core_models.py's MoE Llama at 4 layers: SequentialMLP experts on layers 0 and
//     2, shared experts): megatron-core's TP=2 x PP=2 save, whose keys number the layers
//     (non-homogeneous) and carry an expert axis, loads into tessera bit for bit, and tessera's
//     TP=2 x PP=2 save loads into megatron-core.
//
// The binary exits 77 (CTest's SKIP_RETURN_CODE) when the tdist venv is absent.
#include <gtest/gtest.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <iterator>

#include <nlohmann/json.hpp>

#include "tessera/ckpt/checkpoint.h"
#include "tessera/ckpt/safetensors.h"
#include "tessera/ckpt/torch_dist.h"

namespace fs = std::filesystem;

namespace tessera {
namespace {

const std::string kScript = std::string(TESSERA_SOURCE_DIR) + "/tests/reference/megatron_dist_checkpoint.py";
const std::string kPython = std::string(TESSERA_TDIST_VENV) + "/bin/python";

fs::path scratch(const std::string& name) {
  const fs::path d = fs::path(TESSERA_BINARY_DIR) / "Testing" / "tmp" / (name + "_" + std::to_string(getpid()));
  fs::remove_all(d);
  fs::create_directories(d);
  return d;
}

std::string read_text(const fs::path& p) {
  std::ifstream in(p);
  return {std::istreambuf_iterator<char>(in), std::istreambuf_iterator<char>()};
}

// Runs a command line; its output goes to LOG, whose tail the failure shows.
testing::AssertionResult run(const std::string& cmd, const fs::path& log) {
  const int s = std::system(("timeout 300 " + cmd + " > " + log.string() + " 2>&1").c_str());
  if (WIFEXITED(s) && WEXITSTATUS(s) == 0) return testing::AssertionSuccess();
  const std::string out = read_text(log);
  return testing::AssertionFailure() << cmd << "\n" << out.substr(out.size() > 4000 ? out.size() - 4000 : 0);
}

// The flags of the reference's models (megatron_dist_checkpoint.py GPT and LLAMA).
std::vector<std::string> model_flags(bool llama, bool moe = false) {
  std::vector<std::string> f = {"--num-layers", "4", "--hidden-size", "32", "--num-attention-heads", "4",
                                "--seq-length", "16", "--max-position-embeddings", "16", "--tokenizer-type",
                                "NullTokenizer", "--vocab-size", "99", "--make-vocab-size-divisible-by", "64",
                                "--hidden-dropout", "0", "--attention-dropout", "0"};
  if (llama)
    f.insert(f.end(), {"--group-query-attention", "--num-query-groups", "2", "--kv-channels", "8", "--ffn-hidden-size",
                       "64", "--swiglu", "--normalization", "RMSNorm", "--norm-epsilon", "1e-5",
                       "--position-embedding-type", "rope", "--rotary-base", "500000", "--disable-bias-linear",
                       "--untie-embeddings-and-output-weights"});
  if (moe)
    f.insert(f.end(), {"--num-experts", "4", "--moe-router-topk", "2", "--moe-layer-freq", "2",
                       "--moe-shared-expert-intermediate-size", "32", "--moe-aux-loss-coeff", "0.01"});
  return f;
}

constexpr const char* kLaunch4 =
    "env -u MASTER_ADDR -u MASTER_PORT -u RANK -u WORLD_SIZE " TESSERA_EXE " launch --standalone --nproc_per_node 4 ";
constexpr const char* kTp2Pp2 = "--tensor-model-parallel-size 2 --pipeline-model-parallel-size 2";
constexpr const char* kTp2Dp2DistributedOptimizer = "--tensor-model-parallel-size 2 --use-distributed-optimizer";

// `tessera launch` of a run of 3 iterations in four processes saving in `format` into `save`.
std::string train_command(bool llama, const std::string& format, const fs::path& save, const std::string& layout,
                          bool moe = false) {
  std::string cmd = std::string(kLaunch4) + "train";
  for (const std::string& f : model_flags(llama, moe)) cmd += " " + f;
  return cmd + " " + layout + " --mock-data --micro-batch-size 1"
               " --global-batch-size 4 --train-iters 3 --lr 1e-2 --min-lr 1e-4 --eval-iters 0 --init-method-std 0.2"
               " --deterministic-mode --save " + save.string() + " --save-interval 3 --ckpt-format " + format;
}

// `tessera launch` continuing megatron-core's TP=2 x PP=2 save in `from` to iteration 8 with its
// args, `extra` flags added.
std::string continue_command(const std::string& from, const std::string& extra) {
  return std::string(kLaunch4) + "train --load " + from +
         " --use-checkpoint-args --use-checkpoint-opt_param-scheduler --mock-data --micro-batch-size 1"
         " --global-batch-size 8 --train-iters 8 --lr 1e-3 --eval-iters 0 --log-interval 1 " + extra;
}

// Everything the tests compare, made once, with two reference invocations: megatron-core's saves
// (TP=2 x PP=2 plain, TP=2 x DP=2 distributed optimizer, both models), tessera's torch_dist runs
// (each model: TP=2 x PP=2, and TP=2 x DP=2 with the distributed optimizer; Megatron's run
// continued), then megatron-core's loads of all of them (dump jobs).
class MegatronDist : public testing::TestWithParam<std::string> {
 protected:
  static void SetUpTestSuite() {
    dir_ = new fs::path(scratch("torch_dist"));
    failure_ = new std::string;
    const fs::path& d = *dir_;
    auto step = [](testing::AssertionResult r) {
      if (!r && failure_->empty()) *failure_ = r.message();
      return static_cast<bool>(r);
    };
    if (!step(run(kPython + " -W ignore " + kScript + " save " + (d / "megatron").string() +
                      " --models gpt llama moe --distributed-optimizer-layout 2 1",
                  d / "save.log")))
      return;
    nlohmann::json jobs = nlohmann::json::array();
    auto job = [&](const fs::path& ckpt, const std::string& model, int tp, int pp, const fs::path& out) {
      jobs.push_back({{"ckpt", ckpt.string()}, {"model", model}, {"tp", tp}, {"pp", pp}, {"out", out.string()}});
      return &jobs.back();
    };
    for (const std::string m : {"gpt", "llama"}) {
      const bool llama = m == "llama";
      (*job(d / "megatron" / m, m, 1, 1, d / (m + ".safetensors")))["optim"] = true;
      const fs::path plain = d / ("tessera_" + m), distopt = d / ("tessera_distopt_" + m), resume = d / ("resume_" + m);
      for (const fs::path& f : {plain, distopt, resume}) fs::create_directories(f);
      step(run(train_command(llama, "torch_dist", plain / "dist" / m, kTp2Pp2), plain / "train_dist.log"));
      (*job(plain / "dist" / m, m, 1, 1, plain / (m + ".safetensors")))["optim"] = true;
      step(run(train_command(llama, "torch_dist", distopt / "dist" / m, kTp2Dp2DistributedOptimizer),
               distopt / "train_dist.log"));
      nlohmann::json* j = job(distopt / "dist" / m, m, 1, 2, distopt / (m + ".safetensors"));
      (*j)["optim"] = (*j)["distributed"] = true;
      step(run(continue_command((d / "megatron" / m).string(),
                                "--save " + (resume / "continued" / m).string() + " --save-interval 8"),
               resume / "train.log"));
      // One model is enough for the objects megatron-core's load asks for at the saved layout.
      if (!llama) (*job(resume / "continued" / m, m, 2, 2, resume / (m + ".safetensors")))["rng"] = true;
    }
    // MoE: megatron-core's save, and tessera's TP=2 x PP=2 one.
    (*job(d / "megatron" / "moe", "moe", 1, 1, d / "moe.safetensors"))["optim"] = true;
    fs::create_directories(d / "tessera_moe");
    step(run(train_command(true, "torch_dist", d / "tessera_moe" / "dist", std::string(kTp2Pp2) + " --sequence-parallel",
                           true),
             d / "tessera_moe" / "train_dist.log"));
    (*job(d / "tessera_moe" / "dist", "moe", 1, 1, d / "tessera_moe" / "moe.safetensors"))["optim"] = true;
    step(run(train_command(true, "torch_dist", d / "tessera_moe" / "distopt",
                           std::string(kTp2Dp2DistributedOptimizer) + " --sequence-parallel", true),
             d / "tessera_moe" / "train_distopt.log"));
    nlohmann::json* moe_distopt = job(d / "tessera_moe" / "distopt", "moe", 1, 2, d / "tessera_moe" / "distopt.safetensors");
    (*moe_distopt)["optim"] = (*moe_distopt)["distributed"] = true;
    std::ofstream(d / "jobs.json") << jobs.dump(1);
    step(run(kPython + " -W ignore " + kScript + " dump " + (d / "jobs.json").string(), d / "dump.log"));
  }
  static void TearDownTestSuite() {
    if (failure_->empty()) fs::remove_all(*dir_);
    delete dir_;
    delete failure_;
  }
  void SetUp() override { ASSERT_TRUE(failure_->empty()) << *failure_; }

  std::string megatron_dir() const { return (*dir_ / "megatron" / GetParam()).string(); }
  safetensors::Reader expected() const {
    return safetensors::Reader::open((*dir_ / (GetParam() + ".safetensors")).string());
  }

  static fs::path* dir_;
  static std::string* failure_;
};
fs::path* MegatronDist::dir_ = nullptr;
std::string* MegatronDist::failure_ = nullptr;

// tessera's shape of a dumped (TP=1, Megatron-named) tensor: SwiGLU's fc1 [2F, H] is [2, F, H]
// (the dense MLP's, each expert's, the shared experts').
Shape tessera_shape(const std::string& name, Shape shape, bool swiglu) {
  if (swiglu && name.find(".linear_fc1.") != std::string::npos) {
    shape[0] /= 2;
    shape.insert(shape.begin(), 2);
  }
  return shape;
}

// Loads DIR's checkpoint into whole tensors named and shaped as `want`'s (a dump of the
// reference: parameters under Megatron's TP=1 names, "optimizer.<kind>.<name>" their state) and
// expects each bit for bit equal to want's; returns how many were compared. `fp32_param` is
// compared against the parameter (it is what a load with the optimizer fills the parameter from).
size_t expect_loads_bit_for_bit(const std::string& dir, int64_t iteration, const safetensors::Reader& want,
                                bool swiglu) {
  std::vector<NamedTensor> model, optimizer;
  std::vector<std::vector<float>> buffers;
  buffers.reserve(want.tensors().size());
  for (const safetensors::TensorInfo& t : want.tensors()) {
    if (t.name == "iteration" || t.name.rfind("rng.", 0) == 0 || t.name.rfind("optimizer.fp32_param.", 0) == 0)
      continue;
    const bool state = t.name.rfind("optimizer.", 0) == 0;
    const std::string name = state ? t.name.substr(std::strlen("optimizer.")) : t.name;
    buffers.emplace_back(t.numel, -1.0f);
    (state ? optimizer : model).push_back({name, Tensor(buffers.back().data(), DType::F32,
                                                        tessera_shape(name, t.shape, swiglu), nullptr)});
  }
  EXPECT_FALSE(optimizer.empty());
  load_checkpoint(dir, iteration, model, optimizer, true);
  size_t compared = 0;
  for (const std::vector<NamedTensor>* set : {&model, &optimizer})
    for (const NamedTensor& t : *set) {
      const std::string dumped = set == &optimizer ? "optimizer." + t.name : t.name;
      const std::vector<float> w = want.read_f32(dumped);
      EXPECT_EQ(std::memcmp(w.data(), t.tensor.f32(), w.size() * sizeof(float)), 0) << dumped;
      if (set == &model && want.contains("optimizer.fp32_param." + t.name))
        EXPECT_EQ(want.read_f32("optimizer.fp32_param." + t.name), w) << t.name;
      ++compared;
    }
  EXPECT_EQ(optimizer.size(), 2 * model.size());
  return compared;
}

TEST_P(MegatronDist, ItsSaveLoadsIntoTesseraBitForBit) {
  const std::string dir = megatron_dir();
  ASSERT_TRUE(is_torch_dist_checkpoint(dir, 7));
  const CheckpointState s = read_checkpoint_metadata(dir, 7);
  EXPECT_TRUE(s.megatron_format);
  EXPECT_EQ(s.iteration, 7);
  EXPECT_EQ(s.consumed_train_samples, 56);
  EXPECT_EQ(s.scheduler_num_steps, 56);
  EXPECT_EQ(s.optimizer_steps, 1);
  EXPECT_EQ(s.layout.tensor_parallel, 2);
  EXPECT_EQ(s.layout.pipeline_parallel, 2);
  EXPECT_EQ(s.layout.padded_vocab_size, 128);

  EXPECT_GT(expect_loads_bit_for_bit(dir, 7, expected(), GetParam() == "llama"), GetParam() == "llama" ? 60u : 100u);
  // Megatron's rng_state objects (get_rng_state's ShardedObject, numpy's state an ndarray) read.
  for (int tp = 0; tp < 2; ++tp)
    for (int pp = 0; pp < 2; ++pp) EXPECT_TRUE(read_torch_dist_rng_state(dir, 7, {tp, 2, pp, 2})) << tp << pp;
  EXPECT_FALSE(read_torch_dist_rng_state(dir, 7, {0, 1, 0, 1}));
}

// Megatron's distributed optimizer saved at TP=2 PP=1 DP=2 in its default layout
// (fully_sharded_model_space: N-D state reformulated, flat ranges per DP rank, one of them cut
// between the ranks) loads into tessera to the values of the optimizer that saved it, bit for bit.
// Before the reader joined flat ranges, loading its optimizer was an error.
TEST_P(MegatronDist, ItsDistributedOptimizerSaveLoadsIntoTesseraBitForBit) {
  const std::string dir = megatron_dir() + "_distopt";
  const CheckpointState s = read_checkpoint_metadata(dir, 7);
  EXPECT_EQ(s.optimizer_steps, 1);
  EXPECT_EQ(s.layout.data_parallel, 2);
  // .metadata's reformulated state back in its original shape, one chunk per TP block, joined
  // from its DP ranges: fc2 [L, H, F] split on F over TP=2 (megatron-core cut GPT's layer-1 blocks
  // between the DP ranks).
  const DcpMetadata meta = read_dcp_metadata(dir + "/iter_0000007");
  const auto fc2 = std::find_if(meta.tensors.begin(), meta.tensors.end(), [](const DcpTensor& t) {
    return t.key == "optimizer.state.exp_avg.decoder.layers.mlp.linear_fc2.weight";
  });
  ASSERT_NE(fc2, meta.tensors.end());
  EXPECT_EQ(fc2->size, (std::vector<int64_t>{4, 32, GetParam() == "llama" ? 64 : 128}));
  EXPECT_EQ(fc2->chunks.size(), 8u);
  size_t parts = 0;
  for (const DcpChunk& c : fc2->chunks) parts += c.parts.size();
  EXPECT_EQ(parts, GetParam() == "gpt" ? 10u : 8u);
  const safetensors::Reader want =
      safetensors::Reader::open((*dir_ / "megatron" / (GetParam() + "_distopt.safetensors")).string());
  EXPECT_GT(expect_loads_bit_for_bit(dir, 7, want, GetParam() == "llama"), GetParam() == "llama" ? 60u : 100u);
}

TEST_P(MegatronDist, InspectReadsEveryChunkAndConvertGivesTheSameWeights) {
  const fs::path out = *dir_ / ("cli_" + GetParam());
  fs::create_directories(out);
  ASSERT_TRUE(run(std::string(TESSERA_EXE) + " ckpt inspect " + megatron_dir(), out / "inspect.log"));
  const std::string inspect = read_text(out / "inspect.log");
  EXPECT_NE(inspect.find("format: Megatron-LM torch_dist"), std::string::npos) << inspect;
  EXPECT_NE(inspect.find("tensor-parallel 2, pipeline-parallel 2"), std::string::npos) << inspect;
  EXPECT_NE(inspect.find("decoder.layers.self_attention.linear_qkv.weight  float32 ["), std::string::npos) << inspect;
  ASSERT_TRUE(run(std::string(TESSERA_EXE) + " ckpt convert " + megatron_dir() + " " + (out / "tessera").string() +
                      " --to tessera --target-tensor-parallel-size 1 --target-pipeline-parallel-size 1",
                  out / "convert.log"));
  const safetensors::Reader got =
      safetensors::Reader::open((out / "tessera" / "iter_0000007" / "mp_rank_00" / "model.safetensors").string());
  const safetensors::Reader want = expected();
  size_t compared = 0;
  for (const safetensors::TensorInfo& t : got.tensors()) {
    const std::vector<float> g = got.read_f32(t), w = want.read_f32(t.name);
    ASSERT_EQ(g, w) << t.name;
    ++compared;
  }
  EXPECT_GT(compared, 20u);
}

// A damaged chunk offset in .metadata is an error naming the file, and so is a global the
// .metadata allow-list does not hold.
TEST_P(MegatronDist, DamagedFilesAreErrorsNamingThem) {
  const fs::path copy = *dir_ / ("damaged_" + GetParam());
  fs::copy(megatron_dir(), copy, fs::copy_options::recursive);
  const fs::path it = copy / "iter_0000007";
  std::vector<char> meta;
  {
    std::ifstream in(it / ".metadata", std::ios::binary);
    meta.assign(std::istreambuf_iterator<char>(in), std::istreambuf_iterator<char>());
  }
  const std::string needle = "torch.distributed.checkpoint.filesystem";
  auto at = std::search(meta.begin(), meta.end(), needle.begin(), needle.end());
  ASSERT_NE(at, meta.end());
  std::string evil = "os                                     ";  // the same length: "os" + spaces
  evil.resize(needle.size(), ' ');
  std::copy(evil.begin(), evil.end(), at);
  std::ofstream(it / ".metadata", std::ios::binary).write(meta.data(), static_cast<std::streamsize>(meta.size()));
  try {
    read_dcp_metadata(it.string());
    FAIL() << "a .metadata naming another module loaded";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find(".metadata"), std::string::npos) << e.what();
    EXPECT_NE(std::string(e.what()).find("never holds"), std::string::npos) << e.what();
  }
  // A .distcp cut short: the chunks past its end are named.
  fs::copy(megatron_dir() + "/iter_0000007/.metadata", it / ".metadata", fs::copy_options::overwrite_existing);
  fs::resize_file(it / "__0_0.distcp", 1000);
  std::vector<NamedTensor> none;
  try {
    std::vector<float> buf(128 * 32);
    load_checkpoint(copy.string(), 7, {{"embedding.word_embeddings.weight",
                                        Tensor(buf.data(), DType::F32, {128, 32}, nullptr)}}, none, false);
    FAIL() << "a truncated .distcp loaded";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("__0_0.distcp"), std::string::npos) << e.what();
  }
}

// megatron-core loads tessera's TP=2 x PP=2 torch_dist save at TP=1 PP=1 with its own
// dist_checkpointing.load (model and Adam moments) to the values tessera loads from it, bit for
// bit (tessera's reader is held to megatron-core's own files above); each rank's rng_state is
// the seeded one.
TEST_P(MegatronDist, TesseraSaveLoadsIntoMegatronCoreAtAnotherLayout) {
  const bool llama = GetParam() == "llama";
  const fs::path out = *dir_ / ("tessera_" + GetParam());
  const fs::path it = out / "dist" / GetParam() / "iter_0000003";
  for (const char* f : {".metadata", "common.pt", "metadata.json", "__0_0.distcp", "__1_0.distcp", "__2_0.distcp",
                        "__3_0.distcp"})
    EXPECT_TRUE(fs::exists(it / f)) << f;
  const safetensors::Reader megatron = safetensors::Reader::open((out / (GetParam() + ".safetensors")).string());
  EXPECT_EQ(megatron.read_i64("iteration"), (std::vector<int64_t>{3}));
  EXPECT_GT(expect_loads_bit_for_bit((out / "dist" / GetParam()).string(), 3, megatron, llama), llama ? 60u : 105u);
  // Each rank's rng_state: the generator states Megatron's seeding leaves (megatron_rng_state.h),
  // a payload tessera's reader takes as Megatron's list of them.
  for (int tp = 0; tp < 2; ++tp)
    for (int pp = 0; pp < 2; ++pp) {
      std::vector<uint8_t> seeded;
      const auto append = [&](std::span<const uint8_t> b) { seeded.insert(seeded.end(), b.begin(), b.end()); };
      append_megatron_rng_state_object(append, 1234, tp, pp);
      EXPECT_EQ(read_torch_dist_rng_state((out / "dist" / GetParam()).string(), 3, {tp, 2, pp, 2}), seeded)
          << tp << pp;
    }
}

// tessera's distributed optimizer at TP=2 PP=1 DP=2 saves torch_dist in Megatron's default layout
// for it (every DP rank its ranges, fully_sharded_model_space), which megatron-core's own
// DistributedOptimizer loads at TP=1 PP=2 DP=2 to the weights, fp32 main parameters and Adam
// moments tessera loads from it, bit for bit. Before, tessera gathered them
// into the plain optimizer's layout, which Megatron's distributed optimizer does not load.
TEST_P(MegatronDist, TesseraDistributedOptimizerSaveLoadsIntoMegatronCore) {
  const bool llama = GetParam() == "llama";
  const fs::path out = *dir_ / ("tessera_distopt_" + GetParam());
  for (int rank = 0; rank < 4; ++rank)  // every DP rank writes its ranges
    EXPECT_TRUE(fs::exists(out / "dist" / GetParam() / "iter_0000003" / ("__" + std::to_string(rank) + "_0.distcp")));
  const safetensors::Reader megatron = safetensors::Reader::open((out / (GetParam() + ".safetensors")).string());
  EXPECT_GT(expect_loads_bit_for_bit((out / "dist" / GetParam()).string(), 3, megatron, llama), llama ? 60u : 105u);
  size_t main = 0;  // the fp32 main parameters megatron-core's DistributedOptimizer loaded
  for (const safetensors::TensorInfo& t : megatron.tensors())
    if (t.name.rfind("optimizer.fp32_param.", 0) == 0) ++main;
  EXPECT_GT(main, llama ? 20u : 35u);
}

// A Megatron run continues in tessera: its TP=2 x PP=2 save resumes with --use-checkpoint-args
// (no model flags on the command line), the optimizer and the scheduler loaded, at iteration 8;
// the torch_dist save of iteration 8 hands back each rank's rng_state as Megatron left it (tessera
// draws nothing from those generators), and megatron-core's load at TP=2 PP=2 takes it with the
// rerun_state_machine objects (what its load_checkpoint asks for at the saved layout). Before,
// tessera's torch_dist saves held neither, and Megatron's resume at the same layout failed.
TEST_P(MegatronDist, ItsRunContinuesInTesseraWithItsArgsAndKeepsItsRngState) {
  const fs::path out = *dir_ / ("resume_" + GetParam());
  const fs::path saved = out / "continued" / GetParam();
  const std::string log = read_text(out / "train.log");
  EXPECT_NE(log.find("loading checkpoint from " + megatron_dir() + " at iteration 7 (Megatron-LM's torch_dist format)"),
            std::string::npos)
      << log;
  EXPECT_NE(log.find("iteration        8/       8"), std::string::npos) << log;
  EXPECT_EQ(log.find("iteration        7/"), std::string::npos) << log;
  for (int tp = 0; tp < 2; ++tp)
    for (int pp = 0; pp < 2; ++pp) {
      const auto before = read_torch_dist_rng_state(megatron_dir(), 7, {tp, 2, pp, 2});
      const auto after = read_torch_dist_rng_state(saved.string(), 8, {tp, 2, pp, 2});
      ASSERT_TRUE(before && after) << tp << pp;
      EXPECT_EQ(*before, *after) << tp << pp;
    }
  if (GetParam() != "gpt") return;  // megatron-core's load of it: one model (the jobs in SetUpTestSuite)
  const safetensors::Reader megatron = safetensors::Reader::open((out / "gpt.safetensors").string());
  EXPECT_EQ(megatron.read_i64("rng.np_rng_state").size(), 624u);
  EXPECT_EQ(megatron.read_i64("rng.torch_rng_state").size(), 5056u);
}

// Megatron's converter run: --ckpt-convert-format torch --ckpt-convert-save DIR loads its
// TP=2 x PP=2 torch_dist save (model, optimizer) and saves it, at the loaded iteration 7, into
// DIR/torch in Megatron's legacy format, then exits without training; the converted files hold
// megatron-core's own values, bit for bit. Before, tessera refused both flags.
TEST_P(MegatronDist, CkptConvertFormatSavesTheLoadedCheckpointAndExits) {
  const fs::path out = *dir_ / ("convert_" + GetParam());
  fs::create_directories(out);
  ASSERT_TRUE(run(continue_command(megatron_dir(), "--ckpt-convert-format torch --ckpt-convert-save " + out.string()),
                  out / "convert.log"));
  const std::string log = read_text(out / "convert.log");
  EXPECT_NE(log.find("> converted checkpoint: torch_dist -> torch."), std::string::npos) << log;
  EXPECT_EQ(log.find("iteration        8/"), std::string::npos) << log;
  const fs::path converted = out / "torch";
  EXPECT_TRUE(fs::exists(converted / "iter_0000007" / "mp_rank_01_001" / "model_optim_rng.pt"));
  EXPECT_FALSE(is_torch_dist_checkpoint(converted.string(), 7));
  EXPECT_GT(expect_loads_bit_for_bit(converted.string(), 7, expected(), GetParam() == "llama"),
            GetParam() == "llama" ? 60u : 100u);
}

// megatron-core's MoE save (TP=2 x PP=2): keys numbered by layer (its moe_layer_freq 2 makes the
// layers non-homogeneous), the experts' fc1/fc2 with an expert axis, loads into tessera bit for
// bit, Adam moments too. Before, tessera took mlp.experts.experts.* for one parameter and failed.
// (One model's case: run once, under "gpt".)
TEST_P(MegatronDist, MoESaveLoadsIntoTesseraBitForBit) {
  if (GetParam() != "gpt") return;
  const std::string dir = (*dir_ / "megatron" / "moe").string();
  const DcpMetadata meta = read_dcp_metadata(dir + "/iter_0000007");
  const auto fc1 = std::find_if(meta.tensors.begin(), meta.tensors.end(), [](const DcpTensor& t) {
    return t.key == "decoder.layers.2.mlp.experts.experts.linear_fc1.weight";
  });
  ASSERT_NE(fc1, meta.tensors.end());
  EXPECT_EQ(fc1->size, (std::vector<int64_t>{4, 128, 32}));
  const safetensors::Reader want = safetensors::Reader::open((*dir_ / "moe.safetensors").string());
  EXPECT_GT(expect_loads_bit_for_bit(dir, 7, want, true), 90u);
  // Its DistributedOptimizer's save (TP=2 x DP=2, fully_sharded_model_space: the experts' state
  // reformulated with both leading axes) against the optimizer that saved it.
  const safetensors::Reader distopt =
      safetensors::Reader::open((*dir_ / "megatron" / "moe_distopt.safetensors").string());
  EXPECT_GT(expect_loads_bit_for_bit(dir + "_distopt", 7, distopt, true), 90u);
}

// tessera's MoE save at TP=2 x PP=2 (the same keys: layers numbered, expert axis, the experts'
// and shared experts' _extra_state objects) loads into megatron-core's GPTModel and optimizer at
// TP=1 PP=1 to the values tessera loads from it, bit for bit; and its distributed optimizer's.
TEST_P(MegatronDist, TesseraMoESaveLoadsIntoMegatronCore) {
  if (GetParam() != "gpt") return;
  const fs::path out = *dir_ / "tessera_moe";
  const safetensors::Reader megatron = safetensors::Reader::open((out / "moe.safetensors").string());
  EXPECT_GT(megatron.tensors().size(), 90u);
  EXPECT_GT(expect_loads_bit_for_bit((out / "dist").string(), 3, megatron, true), 90u);
  // With the distributed optimizer (TP=2 x DP=2), loaded by megatron-core's DistributedOptimizer
  // at TP=1 x PP=2.
  const safetensors::Reader distopt = safetensors::Reader::open((out / "distopt.safetensors").string());
  EXPECT_GT(expect_loads_bit_for_bit((out / "distopt").string(), 3, distopt, true), 90u);
}

INSTANTIATE_TEST_SUITE_P(Models, MegatronDist, testing::Values("gpt", "llama"));

}  // namespace
}  // namespace tessera

int main(int argc, char** argv) {
  if (!fs::exists(tessera::kPython)) {
    std::printf("torch_dist_test: %s is absent (scripts/setup.sh's tdist venv); skipped\n", tessera::kPython.c_str());
    return 77;
  }
  testing::InitGoogleTest(&argc, argv);
  return RUN_ALL_TESTS();
}
