// Hugging Face Llama and Qwen2 folders (hf_llama.h) against the float64 reference
// (tests/reference/llama_reference.py saves a transformers LlamaForCausalLM, whole and
// sharded, and writes the same weights in Megatron's layout by its own mapping, checked there
// against a Megatron-layout forward): every tensor must match bit for bit in both directions,
// since the conversion only moves floats. Then the flag checks, Qwen2's q/k/v biases, tying,
// and broken folders, on copies of the reference folder edited here.
#include "../test_support.h"
#include "tessera/ckpt/hf_llama.h"

#include <gtest/gtest.h>
#include <unistd.h>

#include <cstring>
#include <filesystem>
#include <fstream>
#include <functional>
#include <nlohmann/json.hpp>

#include "tessera/ckpt/hf_export.h"
#include "tessera/ckpt/safetensors.h"

namespace st = tessera::safetensors;
namespace fs = std::filesystem;
using json = nlohmann::json;
using tessera::GPTConfig;
using tessera::HFTensor;
using tessera::Shape;
using Weights = std::map<std::string, std::vector<float>>;

namespace {

fs::path scratch_dir(const std::string& what) {
  return tessera::testing_support::scratch_dir("hf_llama_test", what);
}

using tessera::testing_support::expect_error;

json read_json(const fs::path& p) {
  std::ifstream in(p);
  return json::parse(in);
}

std::vector<HFTensor> read_tensors(const fs::path& file) {
  st::Reader r = st::Reader::open(file.string());
  std::vector<HFTensor> out;
  for (const auto& t : r.tensors()) out.push_back({t.name, t.shape, r.read_f32(t)});
  return out;
}

void write_folder(const fs::path& dir, const json& config, const std::vector<HFTensor>& tensors) {
  fs::create_directories(dir);
  std::ofstream(dir / "config.json") << config.dump(2);
  std::vector<st::WriteEntry> entries;
  for (const HFTensor& t : tensors) entries.push_back({t.name, tessera::DType::F32, t.shape, t.data.data()});
  st::write((dir / "model.safetensors").string(), entries, {{"format", "pt"}});
}

HFTensor& find(std::vector<HFTensor>& ts, const std::string& name) {
  for (auto& t : ts)
    if (t.name == name) return t;
  throw std::runtime_error("test bug: no " + name);
}

bool bit_equal(const std::vector<float>& a, const std::vector<float>& b) {
  return a.size() == b.size() && std::memcmp(a.data(), b.data(), a.size() * sizeof(float)) == 0;
}

// The reference's output, shared by every test program that CTest starts (one per test):
// Testing/tmp/llama_reference_<hash of the scripts that make it>, made once through a
// temporary folder renamed into place, so that concurrent programs never see half of it.
fs::path reference_output(int* status) {
  std::string scripts;
  for (const char* s : {"llama_reference.py", "megatron_training.py", "safetensors_io.py", "data/gpt_dataset_reference.py"}) {
    std::ifstream in(fs::path(TESSERA_SOURCE_DIR) / "tests/reference" / s, std::ios::binary);
    scripts += std::string((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
  }
  const fs::path dir = fs::path(TESSERA_BINARY_DIR) / "Testing" / "tmp" /
                       ("llama_reference_" + std::to_string(std::hash<std::string>{}(scripts)));
  *status = 0;
  if (fs::exists(dir / "train_config.json")) return dir;
  const fs::path tmp = scratch_dir("reference");
  const std::string cmd = std::string("/usr/bin/python3 ") + TESSERA_SOURCE_DIR + "/tests/reference/llama_reference.py --out " +
                          (tmp / "out").string() + " > " + (tmp / "log.txt").string() + " 2>&1";
  *status = std::system(cmd.c_str());
  if (*status != 0) return tmp;  // log.txt says why
  std::error_code ec;
  fs::rename(tmp / "out", dir, ec);  // fails harmlessly when another program got there first
  fs::remove_all(tmp);
  return dir;
}

class HFLlama : public ::testing::Test {
 protected:
  static void SetUpTestSuite() { dir_ = new fs::path(reference_output(&status_)); }
  static void TearDownTestSuite() { delete dir_; }
  void SetUp() override {
    if (status_ != 0) {
      std::ifstream log(*dir_ / "log.txt");
      std::string text((std::istreambuf_iterator<char>(log)), std::istreambuf_iterator<char>());
      FAIL() << "llama_reference.py failed (status " << status_ << "):\n" << text;
    }
    edited_ = scratch_dir(::testing::UnitTest::GetInstance()->current_test_info()->name());
  }
  void TearDown() override {
    if (!HasFailure()) fs::remove_all(edited_);
  }

  // The GPTConfig of the reference's flags, from its train_config.json.
  static GPTConfig config() {
    json m = read_json(*dir_ / "train_config.json")["model"];
    GPTConfig c;
    c.num_layers = m["num_layers"];
    c.hidden_size = m["hidden_size"];
    c.num_attention_heads = m["num_attention_heads"];
    c.num_query_groups = m["num_query_groups"];
    c.kv_channels = m["kv_channels"];
    c.ffn_hidden_size = m["ffn_hidden_size"];
    c.seq_length = m["seq_length"];
    c.max_position_embeddings = m["max_position_embeddings"];
    c.vocab_size = m["vocab_size"];
    c.padded_vocab_size = tessera::padded_vocab_size(m["vocab_size"], m["make_vocab_size_divisible_by"], 1);
    EXPECT_EQ(c.padded_vocab_size, m["padded_vocab_size"].get<int>());
    c.norm_epsilon = m["norm_epsilon"];
    c.normalization = tessera::Normalization::RMSNorm;
    c.position_embedding = tessera::PositionEmbedding::Rope;
    c.rotary_base = m["rotary_base"];
    c.swiglu = true;
    c.add_bias_linear = false;
    c.untie_embeddings_and_output_weights = true;
    return c;
  }
  static fs::path hf() { return *dir_ / "hf"; }
  static json hf_config() { return read_json(hf() / "config.json"); }
  static std::vector<HFTensor> hf_tensors() { return read_tensors(hf() / "model.safetensors"); }

  // Writes a copy of the reference folder with `config` and `tensors` and loads it with `c`.
  Weights load(const json& cfg, const std::vector<HFTensor>& tensors, const GPTConfig& c) {
    fs::remove_all(edited_);
    write_folder(edited_, cfg, tensors);
    return tessera::load_hf_llama(edited_.string(), c);
  }
  std::function<void()> loader(const json& cfg, const GPTConfig& c = config()) {
    return [=, this] { load(cfg, hf_tensors(), c); };
  }
  static json with(const char* key, json v) {
    json c = hf_config();
    c[key] = std::move(v);
    return c;
  }
  // The reference's config.json as transformers 5 writes it: RoPE in rope_parameters only.
  static json v5_config(json rope_parameters) {
    json c = hf_config();
    c.erase("rope_theta");
    c.erase("rope_scaling");
    c["rope_parameters"] = std::move(rope_parameters);
    return c;
  }
  // Llama 3.1's rope_scaling (transformers 4) / rope_parameters without rope_theta (5).
  static json llama3_params(double factor) {
    return {{"rope_type", "llama3"}, {"factor", factor}, {"low_freq_factor", 1.0}, {"high_freq_factor", 4.0},
            {"original_max_position_embeddings", 8192}};
  }

  static fs::path* dir_;
  static int status_;
  fs::path edited_;
};
fs::path* HFLlama::dir_ = nullptr;
int HFLlama::status_ = -1;

void expect_reference_layout(const Weights& got, const fs::path& expected_file, const GPTConfig& c) {
  st::Reader expected = st::Reader::open(expected_file.string());
  const auto specs = tessera::gpt_param_specs(c);
  ASSERT_EQ(got.size(), specs.size());
  for (const tessera::ParamSpec& s : specs) {
    SCOPED_TRACE(s.name);
    ASSERT_TRUE(got.count(s.name));
    EXPECT_EQ(expected.at("megatron." + s.name).shape, s.shape);
    // Bit-exact: the conversion only permutes rows, stacks and pads.
    EXPECT_TRUE(bit_equal(got.at(s.name), expected.read_f32("megatron." + s.name)));
  }
}

}  // namespace

TEST_F(HFLlama, LoadsEveryTensorExactlyInMegatronLayoutWholeAndSharded) {
  const GPTConfig c = config();
  expect_reference_layout(tessera::load_hf_llama(hf().string(), c), *dir_ / "expected_forward.safetensors", c);
  ASSERT_TRUE(fs::exists(*dir_ / "hf_sharded" / "model.safetensors.index.json"));
  expect_reference_layout(tessera::load_hf_model((*dir_ / "hf_sharded").string(), c),
                          *dir_ / "expected_forward.safetensors", c);
}

TEST_F(HFLlama, ExportGivesBackTheHFTensorsAndConfig) {
  const GPTConfig c = config();
  const std::vector<HFTensor> exported = tessera::megatron_to_hf_llama(tessera::load_hf_llama(hf().string(), c), c);
  std::vector<HFTensor> original = hf_tensors();
  ASSERT_EQ(exported.size(), original.size());
  for (const HFTensor& t : exported) {
    SCOPED_TRACE(t.name);
    const HFTensor& o = find(original, t.name);
    EXPECT_EQ(t.shape, o.shape);
    EXPECT_TRUE(bit_equal(t.data, o.data));
  }
  tessera::HFExportSpec spec;
  spec.model = c;
  spec.bos_token_id = spec.eos_token_id = 99;
  const json ours = tessera::llama_config_json(spec), theirs = hf_config();
  for (const char* key : {"architectures", "model_type", "vocab_size", "hidden_size", "intermediate_size",
                          "num_hidden_layers", "num_attention_heads", "num_key_value_heads", "head_dim", "hidden_act",
                          "max_position_embeddings", "rms_norm_eps", "rope_theta", "rope_scaling", "attention_bias",
                          "mlp_bias", "tie_word_embeddings", "bos_token_id", "eos_token_id"})
    EXPECT_EQ(ours[key], theirs[key]) << key;
}

TEST_F(HFLlama, TrainFlagsFromConfigDescribeTheModel) {
  const std::vector<std::string> f = tessera::train_flags_from_hf_config(hf().string());
  std::string joined;
  for (const auto& a : f) joined += a + " ";
  for (const char* want : {"--num-layers 2 ", "--hidden-size 64 ", "--num-attention-heads 4 ",
                           "--group-query-attention --num-query-groups 2 ", "--ffn-hidden-size 128 ",
                           "--position-embedding-type rope ", "--rotary-base 10000 ", "--normalization RMSNorm ",
                           "--norm-epsilon 1e-05 ", "--swiglu ", "--disable-bias-linear ",
                           "--untie-embeddings-and-output-weights ", "--vocab-size 99 "})
    EXPECT_NE(joined.find(want), std::string::npos) << want << " not in " << joined;
  EXPECT_EQ(joined.find("--add-qkv-bias"), std::string::npos) << joined;
  EXPECT_EQ(joined.find("--kv-channels"), std::string::npos) << joined;
}

TEST_F(HFLlama, ConfigMustMatchTheFlags) {
  expect_error(loader(with("num_key_value_heads", 4)), {"num_key_value_heads is 4", "--num-query-groups is 2"});
  expect_error(loader(with("num_hidden_layers", 3)), {"num_hidden_layers is 3", "--num-layers is 2"});
  expect_error(loader(with("intermediate_size", 96)), {"intermediate_size is 96", "--ffn-hidden-size"});
  expect_error(loader(with("head_dim", 32)), {"head_dim is 32", "--kv-channels"});
  expect_error(loader(with("rope_theta", 500000.0)), {"rope_theta is 500000", "--rotary-base 500000"});
  expect_error(loader(with("rms_norm_eps", 1e-6)), {"rms_norm_eps is 1e-06", "--norm-epsilon"});
  expect_error(loader(with("vocab_size", 129)), {"vocab_size 129", "128"});
  expect_error(loader(with("hidden_act", "gelu")), {"hidden_act is \"gelu\""});
  expect_error(loader(with("rope_scaling", llama3_params(8.0))), {"rope_type is \"llama3\"", "--use-rope-scaling"});
  expect_error(loader(with("attention_bias", true)), {"attention_bias is true", "mlp_bias"});
  expect_error(loader(with("model_type", "mistral")), {"model_type is \"mistral\""});

  GPTConfig c = config();
  c.normalization = tessera::Normalization::LayerNorm;
  expect_error(loader(hf_config(), c), {"--normalization RMSNorm"});
  c = config();
  c.position_embedding = tessera::PositionEmbedding::LearnedAbsolute;
  expect_error(loader(hf_config(), c), {"--position-embedding-type rope"});
  c = config();
  c.swiglu = false;
  expect_error(loader(hf_config(), c), {"--swiglu"});
  c = config();
  c.untie_embeddings_and_output_weights = false;
  expect_error(loader(hf_config(), c), {"tie_word_embeddings is false", "--untie-embeddings-and-output-weights"});
  c = config();
  c.add_bias_linear = true;
  expect_error(loader(hf_config(), c), {"biases", "--disable-bias-linear (without --add-qkv-bias)"});
  c = config();
  c.rotary_percent = 0.5f;
  expect_error(loader(hf_config(), c), {"--rotary-percent"});
}

TEST_F(HFLlama, TiedModelsTieOrCopyTheEmbedding) {
  std::vector<HFTensor> ts = hf_tensors();
  std::erase_if(ts, [](const HFTensor& t) { return t.name == "lm_head.weight"; });
  const json tied = with("tie_word_embeddings", true);
  GPTConfig c = config();
  c.untie_embeddings_and_output_weights = false;
  Weights got = load(tied, ts, c);
  EXPECT_EQ(got.count("output_layer.weight"), 0u);
  EXPECT_EQ(got.size(), tessera::gpt_param_specs(c).size());
  // Untied flags start the output layer as a copy of the embedding.
  got = load(tied, ts, config());
  EXPECT_TRUE(bit_equal(got.at("output_layer.weight"), got.at("embedding.word_embeddings.weight")));
  // A stored lm_head that is not the embedding contradicts tie_word_embeddings.
  expect_error([&] { load(tied, hf_tensors(), c); }, {"lm_head.weight differs", "tie_word_embeddings"});
  // Untied: lm_head.weight is required.
  expect_error([&] { load(hf_config(), ts, config()); }, {"missing tensor lm_head.weight", "[100, 64]",
                                                           "output_layer.weight"});
}

TEST_F(HFLlama, Qwen2QKVBiasesFollowTheGroupedRows) {
  const GPTConfig base = config();
  const int64_t NH = 4, NG = 2, R = 2, hd = 16;
  std::vector<HFTensor> ts = hf_tensors();
  // Distinct bias values: part p (q 1, k 2, v 3), head h, channel d -> 1000 p + 100 h + d.
  for (int l = 0; l < base.num_layers; ++l)
    for (int p = 1; p <= 3; ++p) {
      const int64_t heads = p == 1 ? NH : NG;
      HFTensor b{"model.layers." + std::to_string(l) + ".self_attn." + "qkv"[p - 1] + "_proj.bias", {heads * hd}, {}};
      for (int64_t h = 0; h < heads; ++h)
        for (int64_t d = 0; d < hd; ++d) b.data.push_back(static_cast<float>(1000 * p + 100 * h + d));
      ts.push_back(b);
    }
  json qwen = hf_config();
  qwen["model_type"] = "qwen2";
  qwen["architectures"] = json::array({"Qwen2ForCausalLM"});
  for (const char* key : {"head_dim", "attention_bias", "mlp_bias"}) qwen.erase(key);
  GPTConfig c = base;
  c.add_qkv_bias = true;
  Weights got = load(qwen, ts, c);
  const std::vector<float>& bias = got.at("decoder.layers.1.self_attention.linear_qkv.bias");
  ASSERT_EQ(bias.size(), static_cast<size_t>((NH + 2 * NG) * hd));
  // Group g: the q heads g*R .. g*R+R-1, then k_g, then v_g.
  for (int64_t g = 0; g < NG; ++g)
    for (int64_t slot = 0; slot < R + 2; ++slot)
      for (int64_t d = 0; d < hd; ++d) {
        const int64_t p = slot < R ? 1 : slot == R ? 2 : 3, h = slot < R ? g * R + slot : g;
        EXPECT_EQ(bias[(g * (R + 2) + slot) * hd + d], 1000 * p + 100 * h + d) << g << " " << slot << " " << d;
      }
  // Without the biases in the flags the difference names them.
  expect_error([&] { load(qwen, ts, base); }, {"--disable-bias-linear --add-qkv-bias"});
  // Qwen2 exports as Qwen2 with the same tensors.
  tessera::HFExportSpec spec;
  spec.model = c;
  EXPECT_EQ(tessera::llama_config_json(spec)["architectures"], json::array({"Qwen2ForCausalLM"}));
  std::vector<HFTensor> back = tessera::megatron_to_hf_llama(got, c);
  ASSERT_EQ(back.size(), ts.size());
  for (const HFTensor& t : back) EXPECT_TRUE(bit_equal(t.data, find(ts, t.name).data)) << t.name;
  // A sliding window is not full causal attention.
  qwen["use_sliding_window"] = true;
  expect_error([&] { load(qwen, ts, c); }, {"use_sliding_window is true"});
}

TEST_F(HFLlama, UnexpectedMissingAndBufferTensors) {
  std::vector<HFTensor> ts = hf_tensors();
  ts.push_back({"model.layers.0.self_attn.rotary_emb.inv_freq", {8}, std::vector<float>(8, 1.0f)});
  EXPECT_NO_THROW(load(hf_config(), ts, config()));  // RoPE's buffer of older files
  ts.push_back({"model.layers.2.input_layernorm.weight", {64}, std::vector<float>(64)});
  expect_error([&] { load(hf_config(), ts, config()); }, {"unexpected tensor model.layers.2.input_layernorm.weight"});
  ts = hf_tensors();
  std::erase_if(ts, [](const HFTensor& t) { return t.name == "model.layers.1.mlp.up_proj.weight"; });
  expect_error([&] { load(hf_config(), ts, config()); },
               {"missing tensor layers.1.mlp.up_proj.weight", "[128, 64]", "decoder.layers.1.mlp.linear_fc1.weight"});
  ts = hf_tensors();
  find(ts, "model.layers.0.self_attn.k_proj.weight").shape = {64, 32};
  expect_error([&] { load(hf_config(), ts, config()); }, {"model.layers.0.self_attn.k_proj.weight", "[64, 32]", "[32, 64]"});
}

TEST_F(HFLlama, ShardIndexMustAgreeWithTheShards) {
  const fs::path sharded = edited_;
  fs::remove_all(sharded);
  fs::copy(*dir_ / "hf_sharded", sharded);
  json index = read_json(sharded / "model.safetensors.index.json");
  auto& map = index["weight_map"];
  const std::string first = map["model.norm.weight"];
  map["model.norm.weight"] = first == "model-00001-of-00004.safetensors" ? "model-00002-of-00004.safetensors"
                                                                         : "model-00001-of-00004.safetensors";
  std::ofstream(sharded / "model.safetensors.index.json") << index.dump();
  expect_error([&] { tessera::load_hf_llama(sharded.string(), config()); },
               {"model.safetensors.index.json", "model.norm.weight", "does not hold it"});
  fs::remove(sharded / "model.safetensors.index.json");
  expect_error([&] { tessera::load_hf_llama(sharded.string(), config()); }, {"model.safetensors: not found"});
}

TEST_F(HFLlama, RopeInBothLayoutsOfTransformers) {
  GPTConfig base500k = config();
  base500k.rotary_base = 500000.0f;
  // transformers 5: rope_parameters, no top-level rope_theta. Its base is read, not 10000.
  const json v5 = v5_config({{"rope_theta", 500000.0}, {"rope_type", "default"}});
  EXPECT_NO_THROW(load(v5, hf_tensors(), base500k));
  expect_error(loader(v5), {"rope_theta is 500000 but --rotary-base is 10000", "--rotary-base 500000"});
  // Both layouts (tessera's export): they must agree.
  json both = v5;
  both["rope_theta"] = 500000.0;
  both["rope_scaling"] = nullptr;
  EXPECT_NO_THROW(load(both, hf_tensors(), base500k));
  both["rope_theta"] = 10000.0;
  expect_error(loader(both, base500k), {"rope_parameters says rope_theta 500000", "rope_theta and rope_scaling say "
                                                                                   "rope_theta 10000"});
  // rope_parameters without rope_theta takes the top-level one, then transformers' default.
  EXPECT_NO_THROW(load(v5_config({{"rope_type", "default"}}), hf_tensors(), config()));
}

TEST_F(HFLlama, Llama3ScalingIsUseRopeScaling) {
  GPTConfig scaled = config();
  scaled.use_rope_scaling = true;
  scaled.rope_scaling_factor = 32.0f;
  json v5_params = llama3_params(32.0);
  v5_params["rope_theta"] = 10000.0;
  for (const json& cfg : {with("rope_scaling", llama3_params(32.0)), v5_config(v5_params)}) {
    SCOPED_TRACE(cfg.contains("rope_parameters") ? "transformers 5" : "transformers 4");
    EXPECT_NO_THROW(load(cfg, hf_tensors(), scaled));
    expect_error(loader(cfg), {"rope_type is \"llama3\"", "--use-rope-scaling --rope-scaling-factor 32"});
    GPTConfig factor8 = scaled;
    factor8.rope_scaling_factor = 8.0f;
    expect_error(loader(cfg, factor8), {"rope_scaling factor is 32 but --rope-scaling-factor is 8",
                                        "--rope-scaling-factor 32"});
  }
  expect_error(loader(hf_config(), scaled), {"rope_type is \"default\"", "drop --use-rope-scaling"});
  // Older files spell rope_type "type".
  json typed = llama3_params(8.0);
  typed["type"] = typed["rope_type"];
  typed.erase("rope_type");
  scaled.rope_scaling_factor = 8.0f;
  EXPECT_NO_THROW(load(with("rope_scaling", typed), hf_tensors(), scaled));

  // The flags import-hf derives, and the config an export writes: both layouts.
  fs::remove_all(edited_);
  write_folder(edited_, v5_config(v5_params), hf_tensors());
  std::string joined;
  for (const auto& a : tessera::train_flags_from_hf_config(edited_.string())) joined += a + " ";
  EXPECT_NE(joined.find("--use-rope-scaling --rope-scaling-factor 32 "), std::string::npos) << joined;
  tessera::HFExportSpec spec;
  spec.model = config();
  spec.model.use_rope_scaling = true;
  spec.model.rope_scaling_factor = 32.0f;
  spec.model.rotary_base = 500000.0f;
  const json exported = tessera::llama_config_json(spec);
  json want_scaling = llama3_params(32.0), want_params = want_scaling;
  want_params["rope_theta"] = 500000.0;
  EXPECT_EQ(exported["rope_theta"], 500000.0);
  EXPECT_EQ(exported["rope_scaling"], want_scaling);
  EXPECT_EQ(exported["rope_parameters"], want_params);
  spec.model.use_rope_scaling = false;
  EXPECT_EQ(tessera::llama_config_json(spec)["rope_scaling"], nullptr);
  EXPECT_EQ(tessera::llama_config_json(spec)["rope_parameters"],
            (json{{"rope_theta", 500000.0}, {"rope_type", "default"}}));
}

TEST_F(HFLlama, OtherRopeTypesAreRefusedNamingFieldAndValue) {
  for (const char* type : {"linear", "dynamic", "yarn", "longrope"}) {
    SCOPED_TRACE(type);
    expect_error(loader(with("rope_scaling", {{"rope_type", type}, {"factor", 4.0}})),
                 {std::string("rope_scaling.rope_type is \"") + type + "\"", "does not implement"});
    expect_error(loader(v5_config({{"rope_type", type}, {"rope_theta", 10000.0}, {"factor", 4.0}})),
                 {std::string("rope_parameters.rope_type is \"") + type + "\""});
  }
  // llama3 with constants other than Megatron's.
  GPTConfig scaled = config();
  scaled.use_rope_scaling = true;
  for (const auto& [field, value] : {std::pair<const char*, json>{"low_freq_factor", 2.0},
                                     {"high_freq_factor", 8.0},
                                     {"original_max_position_embeddings", 4096}}) {
    json params = llama3_params(8.0);
    params[field] = value;
    expect_error(loader(with("rope_scaling", params), scaled),
                 {std::string("rope_scaling.") + field + " is " + value.dump(), "Megatron's --use-rope-scaling"});
  }
  json params = llama3_params(8.0);
  params.erase("factor");
  expect_error(loader(with("rope_scaling", params), scaled), {"rope_scaling.factor is absent"});
  expect_error(loader(v5_config({{"rope_type", "default"}, {"rope_theta", 1e4}, {"partial_rotary_factor", 0.5}})),
               {"rope_parameters.partial_rotary_factor is 0.5"});
  expect_error(loader(v5_config({{"full_attention", {{"rope_type", "default"}}}})), {"per layer type"});
}

TEST_F(HFLlama, OneErrorNamesEveryDifference) {
  json cfg = hf_config();
  cfg["num_hidden_layers"] = 3;
  cfg["intermediate_size"] = 96;
  cfg["rms_norm_eps"] = 1e-6;
  GPTConfig c = config();
  c.swiglu = false;
  expect_error(loader(cfg, c), {"4 differences from the flags", "num_hidden_layers is 3 but --num-layers is 2",
                                "intermediate_size is 96 but --ffn-hidden-size is 128",
                                "rms_norm_eps is 1e-06 but --norm-epsilon is 1e-05", "--swiglu is not given",
                                "pass --swiglu --num-layers 3 --ffn-hidden-size 96 --norm-epsilon 1e-06"});
}

TEST_F(HFLlama, GroupedQueriesNeedGroupQueryAttention) {
  // --num-query-groups 2 without --group-query-attention: one key/value head per query head.
  GPTConfig c = config();
  c.num_query_groups = c.num_attention_heads;
  expect_error(loader(hf_config(), c), {"num_key_value_heads is 2 but the flags give each of the 4 heads its own "
                                        "key and value (no --group-query-attention, or --num-query-groups 4)",
                                        "pass --group-query-attention --num-query-groups 2"});
  c.num_query_groups = 1;
  expect_error(loader(hf_config(), c), {"num_key_value_heads is 2 but --num-query-groups is 1",
                                        "pass --num-query-groups 2"});
}

TEST_F(HFLlama, Qwen2LayerTypesMustBeFullAttention) {
  std::vector<HFTensor> ts = hf_tensors();
  for (int l = 0; l < 2; ++l)
    for (const char* p : {"q", "k", "v"}) {
      const int64_t rows = std::string(p) == "q" ? 64 : 32;
      ts.push_back({"model.layers." + std::to_string(l) + ".self_attn." + p + "_proj.bias", {rows},
                    std::vector<float>(static_cast<size_t>(rows), 0.5f)});
    }
  json qwen = v5_config({{"rope_theta", 10000.0}, {"rope_type", "default"}});
  qwen["model_type"] = "qwen2";
  qwen["architectures"] = json::array({"Qwen2ForCausalLM"});
  for (const char* key : {"head_dim", "attention_bias", "mlp_bias"}) qwen.erase(key);
  qwen["layer_types"] = json::array({"full_attention", "full_attention"});
  GPTConfig c = config();
  c.add_qkv_bias = true;
  EXPECT_NO_THROW(load(qwen, ts, c));
  qwen["layer_types"][1] = "sliding_attention";
  expect_error([&] { load(qwen, ts, c); }, {"layer_types is [\"full_attention\",\"sliding_attention\"]"});
}
