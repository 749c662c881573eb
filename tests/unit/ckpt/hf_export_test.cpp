// `tessera ckpt inspect | export-hf | import-hf`, end to end through the binary:
//   - a checkpoint written by `tessera train --save` is exported, and an independent PyTorch
//     forward with GPT2LMHeadModel's semantics (tests/reference/hf_gpt2_check.py) on the
//     exported folder gives the logits tessera's own forward of the checkpoint gives
//     (max |diff| <= 1e-5 × max |logit|), tied/tanh/4h and untied/erf/n_inner variants;
//   - gpt_reference.py's Hugging Face folder → import-hf → export-hf reproduces every HF
//     tensor bit for bit, and the imported checkpoint loads with `train --load --finetune`;
//   - inspect reports a corrupted file as MISMATCH, a deleted one as MISSING, and exits 1;
//   - Llama-family checkpoints export as LlamaForCausalLM or Qwen2ForCausalLM and
//     transformers' forward of the export gives tessera's logits (llama_hf_check.py);
//   - a model neither GPT-2 nor Llama can express is an error naming the flag.
#include <gtest/gtest.h>
#include <sys/wait.h>
#include <unistd.h>

#include <filesystem>
#include <fstream>
#include <iomanip>
#include <nlohmann/json.hpp>
#include <sstream>

#include "../test_support.h"
#include "tessera/ckpt/checkpoint.h"
#include "tessera/ckpt/hf_export.h"
#include "tessera/ckpt/safetensors.h"
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
const std::string kPython = "/usr/bin/python3";
const std::string kCheck = std::string(TESSERA_SOURCE_DIR) + "/tests/reference/hf_gpt2_check.py";
const std::string kLlamaCheck = std::string(TESSERA_SOURCE_DIR) + "/tests/reference/llama_hf_check.py";

fs::path scratch_dir(const std::string& what) {
  return tessera::testing_support::scratch_dir("hf_export_test", what);
}

std::string read_file(const fs::path& p) {
  std::ifstream f(p, std::ios::binary);
  std::stringstream ss;
  ss << f.rdbuf();
  return ss.str();
}

struct CmdResult {
  int status = -1;
  std::string output;  // stdout and stderr
};

// Runs `cmd` (bounded by `timeout` seconds) with its output in `log`.
CmdResult run(const std::string& cmd, const fs::path& log, int timeout = 60) {
  const std::string full = "timeout " + std::to_string(timeout) + " " + cmd + " > " + log.string() + " 2>&1";
  const int s = std::system(full.c_str());
  return {WIFEXITED(s) ? WEXITSTATUS(s) : -1, read_file(log)};
}

std::string join(const std::vector<std::string>& v) {
  std::string s;
  for (const auto& a : v) s += " '" + a + "'";
  return s;
}

// A tiny NullTokenizer model (vocab 49 + EOD = 50, padded to 64), trained 3 iterations with a
// large init so that the logits are far from uniform.
std::vector<std::string> tiny_model_flags() {
  return {"--num-layers", "2", "--hidden-size", "32", "--num-attention-heads", "4", "--seq-length", "8",
          "--max-position-embeddings", "8", "--tokenizer-type", "NullTokenizer", "--vocab-size", "49",
          "--make-vocab-size-divisible-by", "16", "--init-method-std", "0.2"};
}

std::vector<std::string> train_flags(const fs::path& save) {
  std::vector<std::string> f = tiny_model_flags();
  f.insert(f.end(), {"--mock-data", "--micro-batch-size", "2", "--global-batch-size", "2", "--train-iters", "3",
                     "--lr", "1e-2", "--save", save.string(), "--save-interval", "3", "--eval-iters", "0",
                     "--ckpt-format", "tessera"});
  return f;
}

// `tessera train --save` into dir/ckpt with the tiny model plus `extra` flags.
fs::path train_checkpoint(const fs::path& dir, const std::vector<std::string>& extra) {
  const fs::path ckpt = dir / "ckpt";
  std::vector<std::string> f = train_flags(ckpt);
  f.insert(f.end(), extra.begin(), extra.end());
  CmdResult r = run(kTessera + " train" + join(f), dir / "train.log");
  EXPECT_EQ(r.status, 0) << r.output;
  return ckpt;
}

// Tessera's own forward of the checkpoint's latest iteration on fixed tokens, written as
// tokens I32 [B, T] and logits F32 [B, T, padded vocab] to `out`.
void write_tessera_logits(const fs::path& ckpt, const fs::path& out) {
  const int64_t iteration = *tessera::latest_checkpoint_iteration(ckpt.string());
  std::ostringstream it;
  it << "iter_" << std::setw(7) << std::setfill('0') << iteration;
  json meta = json::parse(read_file(ckpt / it.str() / "metadata.json"));
  std::vector<std::string> flags = meta["args"].get<std::vector<std::string>>();
  std::vector<char*> argv;
  for (auto& f : flags) argv.push_back(f.data());
  tessera::TrainArgs args = tessera::parse_train_args(static_cast<int>(argv.size()), argv.data());
  const tessera::GPTConfig& c = args.model;

  const int B = 2, T = c.seq_length;
  tessera::GPTModel model(c, tessera::cpu_device(), B);
  model.load_weights(tessera::read_checkpoint_model(ckpt.string(), iteration, c));
  std::vector<int32_t> tokens(B * T), positions(B * T), labels(B * T, 0);
  std::vector<float> mask(B * T, 1.0f);
  for (int i = 0; i < B * T; ++i) {
    tokens[i] = (i * 7 + 3) % c.vocab_size;
    positions[i] = i % T;
  }
  tessera::Device* d = &tessera::cpu_device();
  tessera::MicroBatch mb{Tensor(tokens.data(), DType::I32, {B, T}, d), Tensor(positions.data(), DType::I32, {B, T}, d),
                         Tensor(labels.data(), DType::I32, {B, T}, d), Tensor(mask.data(), DType::F32, {B, T}, d)};
  tessera::StepContext step;
  step.training = false;
  model.forward(mb, step);
  Tensor logits = model.logits();
  ASSERT_EQ(logits.shape, (Shape{B, T, c.padded_vocab_size}));
  tessera::safetensors::write(out.string(), {{"tokens", DType::I32, {B, T}, tokens.data()},
                                             {"logits", DType::F32, logits.shape, logits.host<void>()}});
}

// `check` is hf_gpt2_check.py (an independent GPT-2 forward) or llama_hf_check.py (transformers).
void expect_export_matches_tessera(const fs::path& dir, const fs::path& ckpt, const std::string& check = kCheck) {
  const fs::path hf = dir / "hf";
  CmdResult e = run(kTessera + " ckpt export-hf " + ckpt.string() + " " + hf.string(), dir / "export.log");
  ASSERT_EQ(e.status, 0) << e.output;
  ASSERT_NO_FATAL_FAILURE(write_tessera_logits(ckpt, dir / "expected.safetensors"));
  CmdResult p = run(kPython + " " + check + " logits " + hf.string() + " " + (dir / "expected.safetensors").string(),
              dir / "check.log");
  EXPECT_EQ(p.status, 0) << p.output;
  std::printf("%s", p.output.c_str());
}

}  // namespace

TEST(CkptExportHF, TrainedCheckpointGivesTesserasLogitsInPyTorch) {
  const fs::path dir = scratch_dir("tied");
  const fs::path ckpt = train_checkpoint(dir, {});
  expect_export_matches_tessera(dir, ckpt);
  json cfg = json::parse(read_file(dir / "hf" / "config.json"));
  EXPECT_EQ(cfg["vocab_size"], 50);
  EXPECT_EQ(cfg["n_positions"], 8);
  EXPECT_EQ(cfg["n_embd"], 32);
  EXPECT_EQ(cfg["n_layer"], 2);
  EXPECT_EQ(cfg["n_head"], 4);
  EXPECT_TRUE(cfg["n_inner"].is_null());
  EXPECT_EQ(cfg["activation_function"], "gelu_new");
  EXPECT_EQ(cfg["layer_norm_epsilon"], 1e-5);
  EXPECT_EQ(cfg["tie_word_embeddings"], true);
  EXPECT_EQ(cfg["architectures"], json::array({"GPT2LMHeadModel"}));
  EXPECT_EQ(cfg["model_type"], "gpt2");
  EXPECT_EQ(cfg["eos_token_id"], 49);
  auto r = tessera::safetensors::Reader::open((dir / "hf" / "model.safetensors").string());
  EXPECT_EQ(r.at("transformer.wte.weight").shape, (Shape{50, 32}));
  EXPECT_EQ(r.at("transformer.h.1.attn.c_attn.weight").shape, (Shape{32, 96}));
  EXPECT_EQ(r.at("transformer.h.0.mlp.c_fc.weight").shape, (Shape{32, 128}));
  EXPECT_FALSE(r.contains("lm_head.weight"));
  for (const auto& t : r.tensors()) EXPECT_EQ(t.dtype_name, "F32") << t.name;
  if (!::testing::Test::HasFailure()) fs::remove_all(dir);
}

TEST(CkptExportHF, UntiedErfGeluAndFfnSizeAreExpressed) {
  const fs::path dir = scratch_dir("untied");
  const fs::path ckpt =
      train_checkpoint(dir, {"--untie-embeddings-and-output-weights", "--no-bias-gelu-fusion", "--ffn-hidden-size", "48"});
  expect_export_matches_tessera(dir, ckpt);
  json cfg = json::parse(read_file(dir / "hf" / "config.json"));
  EXPECT_EQ(cfg["n_inner"], 48);
  EXPECT_EQ(cfg["activation_function"], "gelu");
  EXPECT_EQ(cfg["tie_word_embeddings"], false);
  auto r = tessera::safetensors::Reader::open((dir / "hf" / "model.safetensors").string());
  EXPECT_EQ(r.at("lm_head.weight").shape, (Shape{50, 32}));
  EXPECT_EQ(r.at("transformer.h.0.mlp.c_fc.weight").shape, (Shape{32, 48}));
  if (!::testing::Test::HasFailure()) fs::remove_all(dir);
}

// Llama-family checkpoints export as LlamaForCausalLM (grouped-query attention, untied, with
// and without biases) or Qwen2ForCausalLM (q/k/v biases only, tied), and transformers'
// float32 forward of the export gives tessera's logits.
TEST(CkptExportHF, LlamaCheckpointsGiveTesserasLogitsInTransformers) {
  const std::vector<std::string> llama = {"--position-embedding-type", "rope", "--normalization", "RMSNorm", "--swiglu",
                                          "--group-query-attention", "--num-query-groups", "2", "--ffn-hidden-size",
                                          "48", "--rotary-base", "500000"};
  struct Variant {
    std::string name;
    std::vector<std::string> flags;
    std::string architecture;
  };
  const Variant variants[] = {
      {"llama", {"--disable-bias-linear", "--untie-embeddings-and-output-weights"}, "LlamaForCausalLM"},
      {"llama_bias", {"--untie-embeddings-and-output-weights"}, "LlamaForCausalLM"},
      {"qwen2", {"--disable-bias-linear", "--add-qkv-bias"}, "Qwen2ForCausalLM"},
  };
  for (const Variant& v : variants) {
    SCOPED_TRACE(v.name);
    const fs::path dir = scratch_dir(v.name);
    std::vector<std::string> flags = llama;
    flags.insert(flags.end(), v.flags.begin(), v.flags.end());
    const fs::path ckpt = train_checkpoint(dir, flags);
    expect_export_matches_tessera(dir, ckpt, kLlamaCheck);
    json cfg = json::parse(read_file(dir / "hf" / "config.json"));
    EXPECT_EQ(cfg["architectures"], json::array({v.architecture}));
    EXPECT_EQ(cfg["num_key_value_heads"], 2);
    EXPECT_EQ(cfg["intermediate_size"], 48);
    EXPECT_EQ(cfg["rope_theta"], 500000.0);
    EXPECT_EQ(cfg["tie_word_embeddings"], v.name == "qwen2");
    if (!::testing::Test::HasFailure()) fs::remove_all(dir);
  }
}

TEST(CkptExportHF, ImportThenExportReproducesTheHFTensors) {
  const fs::path dir = scratch_dir("roundtrip");
  CmdResult ref = run(kPython + " " + TESSERA_SOURCE_DIR + "/tests/reference/gpt_reference.py --out " + (dir / "ref").string(),
                dir / "reference.log");
  ASSERT_EQ(ref.status, 0) << ref.output;
  const fs::path ckpt = dir / "imported", hf = dir / "exported";
  CmdResult i = run(kTessera + " ckpt import-hf " + (dir / "ref" / "hf").string() + " " + ckpt.string(), dir / "import.log");
  ASSERT_EQ(i.status, 0) << i.output;
  EXPECT_NE(i.output.find("--finetune"), std::string::npos) << i.output;
  CmdResult e = run(kTessera + " ckpt export-hf " + ckpt.string() + " " + hf.string(), dir / "export.log");
  ASSERT_EQ(e.status, 0) << e.output;
  CmdResult same = run(kPython + " " + kCheck + " same " + hf.string() + " " + (dir / "ref" / "hf").string(),
                 dir / "same.log");
  EXPECT_EQ(same.status, 0) << same.output;

  // The imported checkpoint is what the reference computes: tessera's forward of it equals
  // the reference's float64 Megatron-layout logits.
  tessera::safetensors::Reader expected =
      tessera::safetensors::Reader::open((dir / "ref" / "expected_forward.safetensors").string());
  // The exported folder's HF forward also matches the reference's logits.
  {
    std::vector<int64_t> tok = expected.read_i64("tokens");  // [2, 17]
    std::vector<int32_t> inputs;
    for (int b = 0; b < 2; ++b)
      for (int t = 0; t < 16; ++t) inputs.push_back(static_cast<int32_t>(tok[b * 17 + t]));
    std::vector<float> logits = expected.read_f32("logits");
    tessera::safetensors::write((dir / "reference_logits.safetensors").string(),
                                {{"tokens", DType::I32, {2, 16}, inputs.data()},
                                 {"logits", DType::F32, {2, 16, 128}, logits.data()}});
    CmdResult p = run(kPython + " " + kCheck + " logits " + hf.string() + " " + (dir / "reference_logits.safetensors").string(),
                dir / "check_reference.log");
    EXPECT_EQ(p.status, 0) << p.output;
    std::printf("%s", p.output.c_str());
  }

  // `tessera train --load IMPORTED --finetune` starts from it.
  json meta = json::parse(read_file(ckpt / "iter_0000000" / "metadata.json"));
  std::vector<std::string> flags = meta["args"].get<std::vector<std::string>>();
  flags.insert(flags.end(), {"--mock-data", "--micro-batch-size", "1", "--train-iters", "1", "--lr", "1e-4",
                             "--eval-iters", "0", "--load", ckpt.string(), "--finetune"});
  CmdResult t = run(kTessera + " train" + join(flags), dir / "finetune.log");
  EXPECT_EQ(t.status, 0) << t.output;
  EXPECT_NE(t.output.find("loading checkpoint from"), std::string::npos) << t.output;
  if (!::testing::Test::HasFailure()) fs::remove_all(dir);
}

TEST(CkptInspect, ReportsTensorsAndChecksums) {
  const fs::path dir = scratch_dir("inspect");
  const fs::path ckpt = train_checkpoint(dir, {});
  CmdResult ok = run(kTessera + " ckpt inspect " + ckpt.string(), dir / "inspect.log");
  EXPECT_EQ(ok.status, 0) << ok.output;
  for (const char* needle : {"iteration: 3 (latest)", "tensor-parallel 1, pipeline-parallel 1", "--hidden-size 32",
                             "OK       mp_rank_00/model.safetensors", "OK       mp_rank_00/optimizer.safetensors",
                             "decoder.layers.1.self_attention.linear_qkv.weight", "[96, 32]", "12288 bytes",
                             "checksums: all 2 files OK"})
    EXPECT_NE(ok.output.find(needle), std::string::npos) << "lacks '" << needle << "':\n" << ok.output;

  // One flipped byte in the middle of the model's data.
  const fs::path model = ckpt / "iter_0000003" / "mp_rank_00" / "model.safetensors";
  {
    std::fstream f(model, std::ios::in | std::ios::out | std::ios::binary);
    f.seekg(static_cast<std::streamoff>(fs::file_size(model) / 2));
    char b = 0;
    f.read(&b, 1);
    b ^= 0x10;
    f.seekp(static_cast<std::streamoff>(fs::file_size(model) / 2));
    f.write(&b, 1);
  }
  CmdResult bad = run(kTessera + " ckpt inspect " + ckpt.string() + " --iteration 3", dir / "inspect_bad.log");
  EXPECT_NE(bad.status, 0) << bad.output;
  EXPECT_NE(bad.output.find("MISMATCH mp_rank_00/model.safetensors"), std::string::npos) << bad.output;
  EXPECT_NE(bad.output.find("OK       mp_rank_00/optimizer.safetensors"), std::string::npos) << bad.output;

  fs::remove(ckpt / "iter_0000003" / "mp_rank_00" / "optimizer.safetensors");
  CmdResult missing = run(kTessera + " ckpt inspect " + ckpt.string(), dir / "inspect_missing.log");
  EXPECT_NE(missing.status, 0) << missing.output;
  EXPECT_NE(missing.output.find("MISSING  mp_rank_00/optimizer.safetensors"), std::string::npos) << missing.output;

  // export-hf refuses the corrupt checkpoint.
  CmdResult e = run(kTessera + " ckpt export-hf " + ckpt.string() + " " + (dir / "hf").string(), dir / "export.log");
  EXPECT_NE(e.status, 0) << e.output;
  if (!::testing::Test::HasFailure()) fs::remove_all(dir);
}

TEST(CkptExportHF, InexpressibleModelsNameTheFlag) {
  struct Case {
    std::vector<std::string> extra;
    const char* flag;
  };
  for (const Case& k : {Case{{"--disable-bias-linear"}, "--disable-bias-linear"},
                        Case{{"--kv-channels", "4"}, "--kv-channels"},
                        // Half Llama: RMSNorm and RoPE with GPT-2's GELU MLP.
                        Case{{"--normalization", "RMSNorm", "--position-embedding-type", "rope"}, "--swiglu"},
                        Case{{"--normalization", "RMSNorm", "--position-embedding-type", "rope", "--swiglu",
                              "--rotary-percent", "0.5"},
                             "--rotary-percent"}}) {
    SCOPED_TRACE(k.flag);
    const fs::path dir = scratch_dir(std::string("inexpressible") + k.flag);
    const fs::path ckpt = train_checkpoint(dir, k.extra);
    CmdResult e = run(kTessera + " ckpt export-hf " + ckpt.string() + " " + (dir / "hf").string(), dir / "export.log");
    EXPECT_EQ(e.status, 2) << e.output;
    EXPECT_NE(e.output.find(k.flag), std::string::npos) << e.output;
    EXPECT_FALSE(fs::exists(dir / "hf" / "model.safetensors"));
    if (!::testing::Test::HasFailure()) fs::remove_all(dir);
  }
}

// GPT-2 BPE: the tokenizer files are copied, bos/eos are 50256, the 47 padding rows of the
// 50304-row embedding are dropped; import-hf derives GPT2BPETokenizer from the exported
// folder's vocab.json/merges.txt, and exporting that again gives the same tensors.
TEST(CkptExportHF, GPT2BPETokenizerFilesAndVocabulary) {
  const fs::path dir = scratch_dir("bpe");
  const std::string data = std::string(TESSERA_SOURCE_DIR) + "/tests/data/gpt2/";
  const fs::path ckpt = dir / "ckpt", hf = dir / "hf";
  const std::vector<std::string> flags = {
      "--num-layers", "1", "--hidden-size", "16", "--num-attention-heads", "2", "--seq-length", "8",
      "--max-position-embeddings", "8", "--tokenizer-type", "GPT2BPETokenizer", "--vocab-file", data + "vocab.json",
      "--merge-file", data + "merges.txt", "--init-method-std", "0.2", "--mock-data", "--micro-batch-size", "1",
      "--train-iters", "1", "--lr", "1e-3", "--save", ckpt.string(), "--save-interval", "1", "--eval-iters", "0",
      "--ckpt-format", "tessera"};
  CmdResult t = run(kTessera + " train" + join(flags), dir / "train.log");
  ASSERT_EQ(t.status, 0) << t.output;
  expect_export_matches_tessera(dir, ckpt);
  json cfg = json::parse(read_file(hf / "config.json"));
  EXPECT_EQ(cfg["vocab_size"], 50257);
  EXPECT_EQ(cfg["bos_token_id"], 50256);
  EXPECT_EQ(cfg["eos_token_id"], 50256);
  EXPECT_EQ(read_file(hf / "vocab.json"), read_file(data + "vocab.json"));
  EXPECT_EQ(read_file(hf / "merges.txt"), read_file(data + "merges.txt"));
  EXPECT_EQ(tessera::safetensors::Reader::open((hf / "model.safetensors").string()).at("transformer.wte.weight").shape,
            (Shape{50257, 16}));

  CmdResult i = run(kTessera + " ckpt import-hf " + hf.string() + " " + (dir / "imported").string(), dir / "import.log");
  ASSERT_EQ(i.status, 0) << i.output;
  EXPECT_NE(i.output.find("GPT2BPETokenizer"), std::string::npos) << i.output;
  CmdResult e = run(kTessera + " ckpt export-hf " + (dir / "imported").string() + " " + (dir / "hf2").string(),
                    dir / "export2.log");
  ASSERT_EQ(e.status, 0) << e.output;
  CmdResult same = run(kPython + " " + kCheck + " same " + (dir / "hf2").string() + " " + hf.string(), dir / "same.log");
  EXPECT_EQ(same.status, 0) << same.output;
  if (!::testing::Test::HasFailure()) fs::remove_all(dir);
}
