// Hugging Face folders of both major versions of transformers against the libraries
// themselves: tests/reference/hf_versions.py saves tiny random Llama (RoPE base 500000; and
// with Llama 3.1's rope_type "llama3" at factors 8 and 32), Qwen2 and GPT-2 models and a
// byte-level BPE tokenizer with transformers 4.47.1 and with 5.x (which writes RoPE as
// rope_parameters and the tokenizer as TokenizersBackend), with each version's logits and
// token ids. Then:
//   - each folder, read by --init-from-hf's conversion with the flags import-hf derives, gives
//     that version's logits in tessera's forward (and the RoPE scaling visibly matters);
//   - the tokenizer of each folder gives that version's ids;
//   - `ckpt import-hf` then `ckpt export-hf` of every folder loads in both versions to the
//     same logits;
//   - export-hf of a HuggingFaceTokenizer run writes the tokenizer's bos and eos ids.
#include <gtest/gtest.h>
#include <sys/wait.h>

#include <cmath>
#include <filesystem>
#include <fstream>
#include <nlohmann/json.hpp>
#include <sstream>

#include "../test_support.h"
#include "tessera/ckpt/hf_export.h"
#include "tessera/ckpt/safetensors.h"
#include "tessera/data/hf_tokenizer.h"
#include "tessera/device/device.h"
#include "tessera/model/gpt.h"
#include "tessera/train/arguments.h"

namespace fs = std::filesystem;
using json = nlohmann::json;
using tessera::DType;
using tessera::Shape;
using tessera::Tensor;

namespace {

const std::string kTessera = std::string(TESSERA_BINARY_DIR) + "/src/tessera/cli/tessera";
const std::string kScript = std::string(TESSERA_SOURCE_DIR) + "/tests/reference/hf_versions.py";
const std::string kPython = std::string(TESSERA_TOOLS_VENV) + "/bin/python";
const char* const kVersions[] = {"4", "5"};
const char* const kCases[] = {"llama", "llama3_8", "llama3_32", "qwen2", "gpt2"};
// float32 forwards of the same weights (hf_versions.py's RTOL).
constexpr double kRtol = 1e-5;

std::string read_file(const fs::path& p) {
  std::ifstream f(p, std::ios::binary);
  std::stringstream ss;
  ss << f.rdbuf();
  return ss.str();
}

// Runs `cmd` (bounded by `timeout` seconds) with its output in `log`: the exit status and output.
std::pair<int, std::string> run(const std::string& cmd, const fs::path& log, int timeout = 120) {
  const int s =
      std::system(("timeout " + std::to_string(timeout) + " " + cmd + " > " + log.string() + " 2>&1").c_str());
  return {WIFEXITED(s) ? WEXITSTATUS(s) : -1, read_file(log)};
}

// The folders hf_versions.py saves with transformers `version`, shared by every test program
// CTest starts: Testing/tmp/hf_versions_<version>_<hash of the script>, made once through a
// temporary folder renamed into place.
fs::path saved_folders(const std::string& version) {
  const fs::path dir = fs::path(TESSERA_BINARY_DIR) / "Testing" / "tmp" /
                       ("hf_versions_" + version + "_" + std::to_string(std::hash<std::string>{}(read_file(kScript))));
  if (fs::exists(dir / "ids.json")) return dir;
  const fs::path tmp = tessera::testing_support::scratch_dir("hf_versions_test", "save" + version);
  const auto [status, output] =
      run(kPython + " " + kScript + " --transformers " + version + " save " + (tmp / "out").string(), tmp / "save.log");
  EXPECT_EQ(status, 0) << output;
  std::error_code ec;
  fs::rename(tmp / "out", dir, ec);  // fails harmlessly when another program got there first
  return dir;
}

tessera::TrainArgs args_of(std::vector<std::string> flags) {
  flags.insert(flags.end(), {"--micro-batch-size", "2", "--train-iters", "1", "--lr", "1e-4", "--mock-data"});
  std::vector<char*> argv;
  for (auto& f : flags) argv.push_back(f.data());
  return tessera::parse_train_args(static_cast<int>(argv.size()), argv.data());
}

// Tessera's forward of the weights on `tokens` [B, T]: logits [B, T, padded vocab].
std::vector<float> tessera_logits(const tessera::GPTConfig& c, const std::map<std::string, std::vector<float>>& w,
                                  std::vector<int32_t> tokens, int B) {
  const int T = static_cast<int>(tokens.size()) / B;
  tessera::GPTModel model(c, tessera::cpu_device(), B);
  model.load_weights(w);
  std::vector<int32_t> positions(tokens.size()), labels(tokens.size(), 0);
  std::vector<float> mask(tokens.size(), 1.0f);
  for (size_t i = 0; i < tokens.size(); ++i) positions[i] = static_cast<int32_t>(i % T);
  tessera::Device* d = &tessera::cpu_device();
  tessera::MicroBatch mb{Tensor(tokens.data(), DType::I32, {B, T}, d), Tensor(positions.data(), DType::I32, {B, T}, d),
                         Tensor(labels.data(), DType::I32, {B, T}, d), Tensor(mask.data(), DType::F32, {B, T}, d)};
  tessera::StepContext step;
  step.training = false;
  model.forward(mb, step);
  const Tensor logits = model.logits();
  EXPECT_EQ(logits.shape, (Shape{B, T, c.padded_vocab_size}));
  const float* p = logits.host<float>();
  return std::vector<float>(p, p + logits.numel());
}

// max |ours - theirs| over the first V columns of [rows, ours_width] and [rows, V], and max |theirs|.
std::pair<double, double> logit_error(const std::vector<float>& ours, int64_t ours_width,
                                      const std::vector<float>& theirs, int64_t V) {
  double diff = 0, scale = 0;
  for (size_t r = 0; r < theirs.size() / V; ++r)
    for (int64_t v = 0; v < V; ++v) {
      diff = std::max(diff, std::fabs(double{ours[r * ours_width + v]} - theirs[r * V + v]));
      scale = std::max(scale, std::fabs(double{theirs[r * V + v]}));
    }
  return {diff, scale};
}

class HFVersions : public ::testing::Test {
 protected:
  static void SetUpTestSuite() {
    for (const char* v : kVersions) dirs_[v] = saved_folders(v);
  }
  static fs::path folder(const std::string& version, const std::string& c) { return dirs_.at(version) / c; }
  static std::map<std::string, fs::path> dirs_;
};
std::map<std::string, fs::path> HFVersions::dirs_;

}  // namespace

TEST_F(HFVersions, FoldersOfBothVersionsGiveTheirLogitsInTessera) {
  for (const char* v : kVersions)
    for (const char* c : kCases) {
      SCOPED_TRACE(std::string("transformers ") + v + ", " + c);
      const fs::path dir = folder(v, c);
      ASSERT_TRUE(fs::exists(dir / "config.json"));
      const json cfg = json::parse(read_file(dir / "config.json"));
      if (std::string(c) != "gpt2")  // the layout each version writes: what makes this test worth having
        EXPECT_EQ(cfg.contains("rope_parameters"), std::string(v) == "5") << cfg.dump();
      const std::vector<std::string> flags = tessera::train_flags_from_hf_config(dir.string());
      tessera::GPTConfig config = args_of(flags).model;
      const auto weights = tessera::load_hf_model(dir.string(), config);

      tessera::safetensors::Reader expected =
          tessera::safetensors::Reader::open((dir / "expected.safetensors").string());
      const std::vector<int64_t> ids = expected.read_i64("tokens");
      const std::vector<int32_t> tokens(ids.begin(), ids.end());
      const std::vector<float> want = expected.read_f32("logits");
      const int B = static_cast<int>(expected.at("tokens").shape[0]);
      const int64_t V = expected.at("logits").shape[2];
      const auto [diff, scale] =
          logit_error(tessera_logits(config, weights, tokens, B), config.padded_vocab_size, want, V);
      EXPECT_LE(diff, kRtol * scale) << "max |diff| " << diff << " of max |logit| " << scale;
      if (config.use_rope_scaling) {
        // Without the scaling the logits are far off: the comparison above sees it.
        tessera::GPTConfig unscaled = config;
        unscaled.use_rope_scaling = false;
        const auto [off, s] =
            logit_error(tessera_logits(unscaled, weights, tokens, B), config.padded_vocab_size, want, V);
        EXPECT_GT(off, 100 * kRtol * s);
      }
    }
}

TEST_F(HFVersions, TokenizersOfBothVersionsGiveTheirIds) {
  for (const char* v : kVersions) {
    SCOPED_TRACE(std::string("transformers ") + v);
    const json ids = json::parse(read_file(dirs_.at(v) / "ids.json"));
    const json tokenizer_config = json::parse(read_file(folder(v, "llama") / "tokenizer_config.json"));
    EXPECT_EQ(tokenizer_config["tokenizer_class"],
              std::string(v) == "5" ? "TokenizersBackend" : "PreTrainedTokenizerFast");
    tessera::data::HuggingFaceTokenizer tok(folder(v, "llama").string());
    for (size_t i = 0; i < ids["texts"].size(); ++i)
      EXPECT_EQ(tok.encode(ids["texts"][i].get<std::string>()), ids["ids"][i].get<std::vector<int32_t>>())
          << ids["texts"][i];
    EXPECT_EQ(tok.bos(), 0);
    EXPECT_EQ(tok.eod(), 1);
  }
}

TEST_F(HFVersions, TokenizerClassesThatChangeTheTokenizerAreRefused) {
  const fs::path work = tessera::testing_support::scratch_dir("hf_versions_test", "classes");
  for (const auto& [key, value] : {std::pair<const char*, const char*>{"tokenizer_class", "LlamaTokenizer"},
                                   {"tokenizer_class", "GPT2Tokenizer"},
                                   {"backend", "sentencepiece"}}) {
    SCOPED_TRACE(std::string(key) + " " + value);
    const fs::path dir = work / value;
    fs::create_directories(dir);
    fs::copy_file(folder("5", "llama") / "tokenizer.json", dir / "tokenizer.json");
    json cfg = json::parse(read_file(folder("5", "llama") / "tokenizer_config.json"));
    cfg[key] = value;
    std::ofstream(dir / "tokenizer_config.json") << cfg.dump();
    tessera::testing_support::expect_error([&] { tessera::data::HuggingFaceTokenizer tok(dir.string()); },
                                           {"tokenizer_config.json", key, value});
  }
  if (!HasFailure()) fs::remove_all(work);
}

TEST_F(HFVersions, ExportsLoadInBothVersionsToTheSameLogits) {
  const fs::path work = tessera::testing_support::scratch_dir("hf_versions_test", "export");
  std::string pairs;
  for (const char* v : kVersions)
    for (const char* c : kCases) {
      const std::string name = std::string(c) + "_" + v;
      const fs::path ckpt = work / ("ckpt_" + name), out = work / name;
      auto [status, output] = run(kTessera + " ckpt import-hf " + folder(v, c).string() + " " + ckpt.string(),
                                  work / ("import_" + name + ".log"));
      ASSERT_EQ(status, 0) << output;
      if (std::string(c).starts_with("llama3"))
        EXPECT_NE(output.find(std::string("--use-rope-scaling --rope-scaling-factor ") + (c[7] == '8' ? "8" : "32")),
                  std::string::npos)
            << output;
      std::tie(status, output) =
          run(kTessera + " ckpt export-hf " + ckpt.string() + " " + out.string(), work / ("export_" + name + ".log"));
      ASSERT_EQ(status, 0) << output;
      pairs += " " + out.string() + "=" + (folder(v, c) / "expected.safetensors").string();
    }
  for (const char* v : kVersions) {
    SCOPED_TRACE(std::string("loaded by transformers ") + v);
    const auto [status, output] =
        run(kPython + " " + kScript + " --transformers " + v + " check-logits" + pairs, work / "check.log");
    EXPECT_EQ(status, 0) << output;
    std::printf("%s", output.c_str());
  }
  if (!HasFailure()) fs::remove_all(work);
}

TEST_F(HFVersions, ExportWritesTheTokenizersBosAndEos) {
  // A Llama run with the folder's HuggingFaceTokenizer (bos 0, eos 1 = the end of document).
  const fs::path work = tessera::testing_support::scratch_dir("hf_versions_test", "bos_eos");
  const fs::path hf = folder("5", "llama"), ckpt = work / "ckpt", out = work / "out";
  std::vector<std::string> flags = tessera::train_flags_from_hf_config(hf.string());
  flags.resize(static_cast<size_t>(std::find(flags.begin(), flags.end(), "--tokenizer-type") - flags.begin()));
  std::string cmd = kTessera + " ckpt import-hf " + hf.string() + " " + ckpt.string();
  for (const std::string& f : flags) cmd += " " + f;
  cmd += " --tokenizer-type HuggingFaceTokenizer --tokenizer-model " + hf.string();
  auto [status, output] = run(cmd, work / "import.log");
  ASSERT_EQ(status, 0) << output;
  std::tie(status, output) =
      run(kTessera + " ckpt export-hf " + ckpt.string() + " " + out.string(), work / "export.log");
  ASSERT_EQ(status, 0) << output;
  const json cfg = json::parse(read_file(out / "config.json"));
  EXPECT_EQ(cfg["bos_token_id"], 0);
  EXPECT_EQ(cfg["eos_token_id"], 1);
  EXPECT_EQ(read_file(out / "tokenizer.json"), read_file(hf / "tokenizer.json"));
  if (!HasFailure()) fs::remove_all(work);
}

TEST_F(HFVersions, MegatronFormatCheckpointsKeepRopeScaling) {
  // --ckpt-format torch records --use-rope-scaling as Megatron's use_rope_scaling, and a factor
  // other than core_r0.10.0's 8 as later Megatron's rope_scaling_factor; export-hf reads both.
  const fs::path work = tessera::testing_support::scratch_dir("hf_versions_test", "megatron_format");
  for (const char* factor : {"8", "32"}) {
    SCOPED_TRACE(std::string("factor ") + factor);
    const fs::path ckpt = work / (std::string("ckpt") + factor), out = work / (std::string("hf") + factor);
    auto [status, output] = run(
        kTessera +
            " train --num-layers 2 --hidden-size 32 --num-attention-heads 4 --seq-length 16 "
            "--max-position-embeddings 16 --position-embedding-type rope --rotary-base 500000 --use-rope-scaling "
            "--rope-scaling-factor " +
            factor +
            " --normalization RMSNorm --swiglu --disable-bias-linear --tokenizer-type NullTokenizer --vocab-size 99 "
            "--mock-data --micro-batch-size 1 --train-iters 1 --lr 1e-3 --eval-iters 0 --save-interval 1 --ckpt-format torch --save " +
            ckpt.string(),
        work / "train.log");
    ASSERT_EQ(status, 0) << output;
    std::tie(status, output) =
        run(kTessera + " ckpt export-hf " + ckpt.string() + " " + out.string(), work / "export.log");
    ASSERT_EQ(status, 0) << output;
    const json cfg = json::parse(read_file(out / "config.json"));
    ASSERT_TRUE(cfg["rope_scaling"].is_object()) << "the scaling was lost: " << cfg.dump();
    EXPECT_EQ(cfg["rope_scaling"]["rope_type"], "llama3") << cfg.dump();
    EXPECT_EQ(cfg["rope_scaling"]["factor"], std::stod(factor)) << cfg.dump();
  }
  if (!HasFailure()) fs::remove_all(work);
}
