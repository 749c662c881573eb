// --init-from-hf: load_hf_gpt2 against the PyTorch reference (tests/reference/gpt_reference.py
// writes a GPT-2 folder in Hugging Face layout and the same weights in Megatron layout; every
// tensor must match exactly, since the conversion only moves floats), plus the error cases on
// small folders written here with tessera's safetensors writer.
#include "../test_support.h"
#include "tessera/ckpt/hf_gpt2.h"

#include <gtest/gtest.h>
#include <unistd.h>

#include <cmath>
#include <filesystem>
#include <fstream>
#include <functional>
#include <nlohmann/json.hpp>
#include <set>

#include "tessera/ckpt/safetensors.h"

namespace st = tessera::safetensors;
namespace fs = std::filesystem;
using json = nlohmann::json;
using tessera::DType;
using tessera::GPTConfig;
using tessera::Shape;

namespace {

fs::path scratch_dir(const std::string& what) {
  return tessera::testing_support::scratch_dir("hf_gpt2_test", what);
}

using tessera::testing_support::expect_error;

// ------------------------------------------------------------------------------------------
// Against the PyTorch reference

class HFReference : public ::testing::Test {
 protected:
  static void SetUpTestSuite() {
    dir_ = new fs::path(scratch_dir("reference"));
    const std::string cmd = std::string("/usr/bin/python3 ") + TESSERA_SOURCE_DIR +
                            "/tests/reference/gpt_reference.py --out " + dir_->string() + " > " +
                            (*dir_ / "log.txt").string() + " 2>&1";
    status_ = std::system(cmd.c_str());
  }
  static void TearDownTestSuite() {
    if (status_ == 0 && !::testing::UnitTest::GetInstance()->Failed()) fs::remove_all(*dir_);
    delete dir_;
  }
  void SetUp() override {
    if (status_ != 0) {
      std::ifstream log(*dir_ / "log.txt");
      std::string text((std::istreambuf_iterator<char>(log)), std::istreambuf_iterator<char>());
      FAIL() << "gpt_reference.py failed (status " << status_ << "):\n" << text;
    }
  }

  // The GPTConfig the reference used, from its train_config.json.
  static GPTConfig config() {
    std::ifstream in(*dir_ / "train_config.json");
    json m = json::parse(in)["model"];
    GPTConfig c;
    c.num_layers = m["num_layers"];
    c.hidden_size = m["hidden_size"];
    c.num_attention_heads = m["num_attention_heads"];
    c.kv_channels = m["kv_channels"];
    c.ffn_hidden_size = m["ffn_hidden_size"];
    c.seq_length = m["seq_length"];
    c.max_position_embeddings = m["max_position_embeddings"];
    c.vocab_size = m["vocab_size"];
    c.padded_vocab_size = tessera::padded_vocab_size(m["vocab_size"], m["make_vocab_size_divisible_by"], 1);
    EXPECT_EQ(c.padded_vocab_size, m["padded_vocab_size"].get<int>());
    c.norm_epsilon = m["norm_epsilon"];
    c.gelu = m["gelu"] == "tanh" ? tessera::ops::GeluKind::Tanh : tessera::ops::GeluKind::Erf;
    c.untie_embeddings_and_output_weights = m["untie_embeddings_and_output_weights"];
    return c;
  }

  static fs::path* dir_;
  static int status_;
};
fs::path* HFReference::dir_ = nullptr;
int HFReference::status_ = -1;

TEST_F(HFReference, LoadsEveryTensorExactlyInMegatronLayout) {
  const GPTConfig c = config();
  auto got = tessera::load_hf_gpt2((*dir_ / "hf").string(), c);
  st::Reader expected = st::Reader::open((*dir_ / "expected_forward.safetensors").string());
  auto specs = tessera::gpt_param_specs(c);
  ASSERT_EQ(got.size(), specs.size());
  for (const tessera::ParamSpec& s : specs) {
    SCOPED_TRACE(s.name);
    ASSERT_TRUE(got.count(s.name));
    const st::TensorInfo& t = expected.at("megatron." + s.name);
    EXPECT_EQ(t.shape, s.shape);
    std::vector<float> want = expected.read_f32(t);
    ASSERT_EQ(got[s.name].size(), want.size());
    // Bit-exact: the conversion only transposes, permutes and pads.
    EXPECT_EQ(std::memcmp(got[s.name].data(), want.data(), want.size() * sizeof(float)), 0);
  }
}

// The reference's gradients are named and shaped exactly as the model's parameter list.
TEST_F(HFReference, ReferenceNamesMatchTheModelsParameters) {
  const GPTConfig c = config();
  st::Reader f = st::Reader::open((*dir_ / "expected_forward.safetensors").string());
  std::set<std::string> grads;
  for (const auto& t : f.tensors())
    if (t.name.starts_with("grad.")) grads.insert(t.name.substr(5));
  std::set<std::string> specs;
  for (const auto& s : tessera::gpt_param_specs(c)) {
    specs.insert(s.name);
    EXPECT_EQ(f.at("grad." + s.name).shape, s.shape) << s.name;
  }
  EXPECT_EQ(grads, specs);
  EXPECT_EQ(f.at("tokens").shape, (Shape{2, c.seq_length + 1}));
  EXPECT_EQ(f.at("logits").shape, (Shape{2, c.seq_length, c.padded_vocab_size}));
  EXPECT_EQ(f.at("loss").shape, (Shape{1}));
  st::Reader tr = st::Reader::open((*dir_ / "expected_train.safetensors").string());
  EXPECT_EQ(tr.at("tokens").shape, (Shape{10, 4, c.seq_length + 1}));
  for (const char* n : {"lm_loss", "grad_norm", "lr"}) EXPECT_EQ(tr.at(n).shape, (Shape{10})) << n;
  EXPECT_EQ(tr.read_f32("lr")[0], 0.0f) << "iteration 1 runs at the warmup's initial LR";
}

// ------------------------------------------------------------------------------------------
// Small synthetic folders

struct HFTensor {
  std::string name;
  Shape shape;
  std::vector<float> v;
  DType dtype = DType::F32;
};

GPTConfig tiny_config() {
  GPTConfig c;
  c.num_layers = 1;
  c.hidden_size = 8;
  c.num_attention_heads = 2;
  c.kv_channels = 4;
  c.ffn_hidden_size = 32;
  c.seq_length = 4;
  c.max_position_embeddings = 4;
  c.vocab_size = 10;
  c.padded_vocab_size = 16;
  c.norm_epsilon = 1e-5f;
  c.gelu = tessera::ops::GeluKind::Tanh;
  return c;
}

json tiny_hf_config() {
  return {{"model_type", "gpt2"}, {"architectures", {"GPT2LMHeadModel"}}, {"n_layer", 1},
          {"n_embd", 8},          {"n_head", 2},                          {"n_positions", 4},
          {"vocab_size", 10},     {"n_inner", nullptr},                   {"activation_function", "gelu_new"},
          {"layer_norm_epsilon", 1e-5}};
}

// A GPT2LMHeadModel state dict with distinct values everywhere (V 10, H 8, F 32, P 4).
std::vector<HFTensor> tiny_tensors(const std::string& prefix = "transformer.") {
  std::vector<HFTensor> t;
  int k = 0;
  auto add = [&](const std::string& name, Shape shape) {
    int64_t n = 1;
    for (int64_t d : shape) n *= d;
    std::vector<float> v(n);
    for (int64_t i = 0; i < n; ++i) v[i] = static_cast<float>(k * 1000 + i) / 1024.0f;  // distinct everywhere
    ++k;
    t.push_back({prefix + name, shape, v});
  };
  add("wte.weight", {10, 8});
  add("wpe.weight", {4, 8});
  add("h.0.ln_1.weight", {8});
  add("h.0.ln_1.bias", {8});
  add("h.0.attn.bias", {1, 1, 4, 4});
  add("h.0.attn.masked_bias", {});
  add("h.0.attn.c_attn.weight", {8, 24});
  add("h.0.attn.c_attn.bias", {24});
  add("h.0.attn.c_proj.weight", {8, 8});
  add("h.0.attn.c_proj.bias", {8});
  add("h.0.ln_2.weight", {8});
  add("h.0.ln_2.bias", {8});
  add("h.0.mlp.c_fc.weight", {8, 32});
  add("h.0.mlp.c_fc.bias", {32});
  add("h.0.mlp.c_proj.weight", {32, 8});
  add("h.0.mlp.c_proj.bias", {8});
  add("ln_f.weight", {8});
  add("ln_f.bias", {8});
  return t;
}

HFTensor& find(std::vector<HFTensor>& ts, const std::string& name) {
  for (auto& t : ts)
    if (t.name == name) return t;
  throw std::runtime_error("test bug: no " + name);
}

void write_folder(const fs::path& dir, const json& config, const std::vector<HFTensor>& ts) {
  fs::create_directories(dir);
  std::ofstream(dir / "config.json") << config.dump(2);
  std::vector<std::vector<uint8_t>> bytes;
  std::vector<st::WriteEntry> entries;
  for (const HFTensor& t : ts) {
    std::vector<uint8_t> b(t.v.size() * tessera::dtype_size(t.dtype));
    for (size_t i = 0; i < t.v.size(); ++i) {
      if (t.dtype == DType::F32) std::memcpy(&b[4 * i], &t.v[i], 4);
      else if (t.dtype == DType::I32) { int32_t x = static_cast<int32_t>(t.v[i]); std::memcpy(&b[4 * i], &x, 4); }
      else {
        uint16_t h = t.dtype == DType::BF16 ? tessera::f32_to_bf16(t.v[i]) : tessera::f32_to_f16(t.v[i]);
        std::memcpy(&b[2 * i], &h, 2);
      }
    }
    bytes.push_back(std::move(b));
  }
  for (size_t i = 0; i < ts.size(); ++i) entries.push_back({ts[i].name, ts[i].dtype, ts[i].shape, bytes[i].data()});
  st::write((dir / "model.safetensors").string(), entries, {{"format", "pt"}});
}

class HFSmall : public ::testing::Test {
 protected:
  void SetUp() override {
    dir_ = scratch_dir(::testing::UnitTest::GetInstance()->current_test_info()->name());
  }
  void TearDown() override {
    if (!HasFailure()) fs::remove_all(dir_);
  }
  // Writes a folder and loads it with `c`.
  std::map<std::string, std::vector<float>> load(const json& config, const std::vector<HFTensor>& ts,
                                                 const GPTConfig& c = tiny_config()) {
    write_folder(dir_ / "m", config, ts);
    return tessera::load_hf_gpt2((dir_ / "m").string(), c);
  }
  std::function<void()> loader(const json& config, const std::vector<HFTensor>& ts,
                               const GPTConfig& c = tiny_config()) {
    return [=, this] { load(config, ts, c); };
  }
  fs::path dir_;
};

void check_layout(std::map<std::string, std::vector<float>>& got, std::vector<HFTensor>& ts, const std::string& prefix) {
  const int64_t H = 8, hd = 4, F = 32, V = 10, Vp = 16;
  // linear_qkv row r holds head r / 3hd, part (r % 3hd) / hd (q, k, v), element r % hd; HF
  // keeps that output in column part*H + head*hd + element of c_attn [in, out].
  const auto& cw = find(ts, prefix + "h.0.attn.c_attn.weight").v;
  const auto& cb = find(ts, prefix + "h.0.attn.c_attn.bias").v;
  const auto& qw = got.at("decoder.layers.0.self_attention.linear_qkv.weight");
  const auto& qb = got.at("decoder.layers.0.self_attention.linear_qkv.bias");
  for (int64_t r = 0; r < 3 * H; ++r) {
    const int64_t head = r / (3 * hd), part = (r % (3 * hd)) / hd, e = r % hd;
    const int64_t col = part * H + head * hd + e;
    EXPECT_EQ(qb[r], cb[col]) << r;
    for (int64_t j = 0; j < H; ++j) EXPECT_EQ(qw[r * H + j], cw[j * 3 * H + col]) << r << "," << j;
  }
  // Conv1D [in, out] -> [out, in].
  const auto& fc = find(ts, prefix + "h.0.mlp.c_fc.weight").v;
  const auto& fc1 = got.at("decoder.layers.0.mlp.linear_fc1.weight");
  for (int64_t o = 0; o < F; ++o)
    for (int64_t i = 0; i < H; ++i) EXPECT_EQ(fc1[o * H + i], fc[i * F + o]);
  const auto& pr = find(ts, prefix + "h.0.mlp.c_proj.weight").v;
  const auto& fc2 = got.at("decoder.layers.0.mlp.linear_fc2.weight");
  for (int64_t o = 0; o < H; ++o)
    for (int64_t i = 0; i < F; ++i) EXPECT_EQ(fc2[o * F + i], pr[i * H + o]);
  const auto& ap = find(ts, prefix + "h.0.attn.c_proj.weight").v;
  const auto& proj = got.at("decoder.layers.0.self_attention.linear_proj.weight");
  for (int64_t o = 0; o < H; ++o)
    for (int64_t i = 0; i < H; ++i) EXPECT_EQ(proj[o * H + i], ap[i * H + o]);
  // Embedding: HF rows first, padding rows zero.
  const auto& wte = find(ts, prefix + "wte.weight").v;
  const auto& emb = got.at("embedding.word_embeddings.weight");
  ASSERT_EQ(emb.size(), static_cast<size_t>(Vp * H));
  for (int64_t i = 0; i < V * H; ++i) EXPECT_EQ(emb[i], wte[i]);
  for (int64_t i = V * H; i < Vp * H; ++i) EXPECT_EQ(emb[i], 0.0f);
  EXPECT_EQ(got.at("decoder.layers.0.pre_mlp_layernorm.bias"), find(ts, prefix + "h.0.ln_2.bias").v);
  EXPECT_EQ(got.at("decoder.final_layernorm.weight"), find(ts, prefix + "ln_f.weight").v);
  EXPECT_EQ(got.count("output_layer.weight"), 0u);
}

TEST_F(HFSmall, LayoutWithAndWithoutPrefix) {
  for (std::string prefix : {"transformer.", ""}) {
    SCOPED_TRACE(prefix);
    auto ts = tiny_tensors(prefix);
    auto got = load(tiny_hf_config(), ts);
    EXPECT_EQ(got.size(), tessera::gpt_param_specs(tiny_config()).size());
    check_layout(got, ts, prefix);
  }
}

TEST_F(HFSmall, HalfPrecisionInputsWiden) {
  auto ts = tiny_tensors();
  find(ts, "transformer.wte.weight").dtype = DType::F16;
  find(ts, "transformer.h.0.mlp.c_fc.weight").dtype = DType::BF16;
  auto got = load(tiny_hf_config(), ts);
  // Expected values are the 16-bit roundings of the originals.
  for (auto& x : find(ts, "transformer.wte.weight").v) x = tessera::f16_to_f32(tessera::f32_to_f16(x));
  for (auto& x : find(ts, "transformer.h.0.mlp.c_fc.weight").v) x = tessera::bf16_to_f32(tessera::f32_to_bf16(x));
  check_layout(got, ts, "transformer.");
}

TEST_F(HFSmall, MissingOrMisshapenTensorsNameTheTensorAndBothShapes) {
  auto ts = tiny_tensors();
  ts.erase(ts.begin() + 13);  // transformer.h.0.mlp.c_fc.bias
  expect_error(loader(tiny_hf_config(), ts), {"missing tensor h.0.mlp.c_fc.bias", "[32]", "decoder.layers.0.mlp.linear_fc1.bias"});

  ts = tiny_tensors();
  find(ts, "transformer.h.0.attn.c_proj.weight") = {"transformer.h.0.attn.c_proj.weight", {8, 9}, std::vector<float>(72)};
  expect_error(loader(tiny_hf_config(), ts), {"transformer.h.0.attn.c_proj.weight", "[8, 9]", "[8, 8]"});

  ts = tiny_tensors();
  find(ts, "transformer.wte.weight") = {"transformer.wte.weight", {10, 8, 1}, std::vector<float>(80)};
  expect_error(loader(tiny_hf_config(), ts), {"transformer.wte.weight", "[10, 8, 1]", "[10, 8]"});

  ts = tiny_tensors();
  find(ts, "transformer.h.0.ln_1.weight").dtype = DType::I32;
  expect_error(loader(tiny_hf_config(), ts), {"transformer.h.0.ln_1.weight", "I32"});

  ts = tiny_tensors();
  ts.push_back({"transformer.h.1.ln_1.weight", {8}, std::vector<float>(8)});
  expect_error(loader(tiny_hf_config(), ts), {"unexpected tensor transformer.h.1.ln_1.weight"});

  ts = tiny_tensors();
  ts.push_back({"h.0.ln_1.weight", {8}, std::vector<float>(8)});
  expect_error(loader(tiny_hf_config(), ts), {"transformer.h.0.ln_1.weight", "h.0.ln_1.weight", "both"});
}

TEST_F(HFSmall, ConfigMustMatchTheFlags) {
  auto ts = tiny_tensors();
  auto with = [&](const char* key, json v) {
    json c = tiny_hf_config();
    c[key] = v;
    return c;
  };
  expect_error(loader(with("n_layer", 2), ts), {"n_layer is 2", "--num-layers is 1"});
  expect_error(loader(with("n_embd", 16), ts), {"--hidden-size"});
  expect_error(loader(with("n_head", 4), ts), {"--num-attention-heads"});
  expect_error(loader(with("n_inner", 16), ts), {"--ffn-hidden-size"});
  expect_error(loader(with("n_positions", 8), ts), {"n_positions is 8", "--max-position-embeddings is 4"});
  expect_error(loader(with("vocab_size", 17), ts), {"vocab_size 17", "16"});
  expect_error(loader(with("activation_function", "gelu"), ts), {"erf GELU", "--no-bias-gelu-fusion"});
  expect_error(loader(with("activation_function", "relu"), ts), {"\"relu\" is not supported"});
  expect_error(loader(with("layer_norm_epsilon", 1e-6), ts), {"layer_norm_epsilon is 1e-06", "--norm-epsilon"});
  expect_error(loader(with("model_type", "llama"), ts), {"model_type"});
  expect_error(loader(with("n_layer", "one"), ts), {"n_layer"});
  expect_error(loader(with("tie_word_embeddings", false), ts), {"--untie-embeddings-and-output-weights"});
  expect_error(loader(with("scale_attn_by_inverse_layer_idx", true), ts), {"scale_attn_by_inverse_layer_idx"});
  json no_layers = tiny_hf_config();
  no_layers.erase("n_layer");
  expect_error(loader(no_layers, ts), {"missing \"n_layer\""});

  GPTConfig erf = tiny_config();
  erf.gelu = tessera::ops::GeluKind::Erf;
  expect_error(loader(tiny_hf_config(), ts, erf), {"tanh GELU", "--no-bias-gelu-fusion"});
  json erf_cfg = with("activation_function", "gelu");
  EXPECT_NO_THROW(load(erf_cfg, ts, erf));

  GPTConfig bigger_tokenizer = tiny_config();
  bigger_tokenizer.vocab_size = 12;  // only a warning: rows 10 and 11 start at zero
  EXPECT_NO_THROW(load(tiny_hf_config(), ts, bigger_tokenizer));
}

TEST_F(HFSmall, OutputLayerTiedOrUntied) {
  GPTConfig untied = tiny_config();
  untied.untie_embeddings_and_output_weights = true;
  auto ts = tiny_tensors();
  expect_error(loader(tiny_hf_config(), ts, untied), {"lm_head.weight", "[10, 8]", "output_layer.weight"});

  HFTensor lm{"lm_head.weight", {10, 8}, std::vector<float>(80)};
  for (size_t i = 0; i < lm.v.size(); ++i) lm.v[i] = -static_cast<float>(i);
  ts.push_back(lm);
  auto got = load(tiny_hf_config(), ts, untied);
  const auto& out = got.at("output_layer.weight");
  ASSERT_EQ(out.size(), 16u * 8);
  for (size_t i = 0; i < 80; ++i) EXPECT_EQ(out[i], lm.v[i]);
  for (size_t i = 80; i < out.size(); ++i) EXPECT_EQ(out[i], 0.0f);
  EXPECT_EQ(got.size(), tessera::gpt_param_specs(untied).size());

  // Tied: a stored lm_head must equal wte.
  expect_error(loader(tiny_hf_config(), ts), {"lm_head.weight differs from wte", "--untie-embeddings-and-output-weights"});
  ts.back().v = find(ts, "transformer.wte.weight").v;
  EXPECT_NO_THROW(load(tiny_hf_config(), ts));
  ts.back().shape = {10, 9};
  ts.back().v.resize(90);
  expect_error(loader(tiny_hf_config(), ts), {"lm_head.weight", "[10, 9]", "[10, 8]"});
}

TEST_F(HFSmall, BrokenFoldersAreErrors) {
  const GPTConfig c = tiny_config();
  expect_error([&] { tessera::load_hf_gpt2((dir_ / "nowhere").string(), c); }, {"nowhere"});

  write_folder(dir_ / "m", tiny_hf_config(), tiny_tensors());
  const fs::path model = dir_ / "m" / "model.safetensors";
  const auto full = fs::file_size(model);
  // Truncations at several points: inside the length, the header and the data.
  for (uintmax_t keep : {uintmax_t{0}, uintmax_t{5}, uintmax_t{40}, full / 2, full - 1}) {
    SCOPED_TRACE(keep);
    write_folder(dir_ / "m", tiny_hf_config(), tiny_tensors());
    fs::resize_file(model, keep);
    expect_error([&] { tessera::load_hf_gpt2((dir_ / "m").string(), c); }, {"model.safetensors"});
  }
  std::ofstream(dir_ / "m" / "config.json") << "{\"n_layer\": 1,";
  expect_error([&] { tessera::load_hf_gpt2((dir_ / "m").string(), c); }, {"config.json", "not valid JSON"});

  write_folder(dir_ / "m", tiny_hf_config(), tiny_tensors());
  fs::remove(model);
  std::ofstream(dir_ / "m" / "pytorch_model.bin") << "pickle";
  expect_error([&] { tessera::load_hf_gpt2((dir_ / "m").string(), c); }, {"model.safetensors: not found", "never loaded"});
}

}  // namespace
