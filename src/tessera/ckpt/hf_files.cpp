#include "tessera/ckpt/hf_files.h"

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <filesystem>

#include "tessera/core/error.h"
#include "tessera/core/file_io.h"
#include "tessera/core/log.h"

namespace tessera {

namespace {

namespace fs = std::filesystem;
using json = nlohmann::json;

json read_json_object(const std::string& path, const std::string& hint) {
  if (!fs::exists(path)) throw usage_error(path + ": not found", hint);
  json j = json::parse(read_file(path), nullptr, /*allow_exceptions=*/false);
  if (j.is_discarded() || !j.is_object())
    throw runtime_error(path + ": not valid JSON, or not a JSON object", "re-download or re-export the model");
  return j;
}

}  // namespace

const char* hf_family_name(HFFamily f) {
  switch (f) {
    case HFFamily::GPT2: return "GPT-2";
    case HFFamily::Llama: return "Llama";
    case HFFamily::Qwen2: return "Qwen2";
    case HFFamily::Mixtral: return "Mixtral";
    case HFFamily::Qwen2Moe: return "Qwen2-MoE";
  }
  return "?";
}

HFConfigFile HFConfigFile::read(const std::string& dir) {
  HFConfigFile c;
  c.path_ = (fs::path(dir) / "config.json").string();
  c.j_ = read_json_object(c.path_, "expected a Hugging Face model folder (config.json and model.safetensors)");
  return c;
}

HFFamily HFConfigFile::family() const {
  static const std::pair<const char*, HFFamily> kModelTypes[] = {
      {"gpt2", HFFamily::GPT2},       {"llama", HFFamily::Llama},        {"qwen2", HFFamily::Qwen2},
      {"mixtral", HFFamily::Mixtral}, {"qwen2_moe", HFFamily::Qwen2Moe}};
  static const std::pair<const char*, HFFamily> kArchitectures[] = {
      {"GPT2LMHeadModel", HFFamily::GPT2},       {"LlamaForCausalLM", HFFamily::Llama},
      {"Qwen2ForCausalLM", HFFamily::Qwen2},     {"MixtralForCausalLM", HFFamily::Mixtral},
      {"Qwen2MoeForCausalLM", HFFamily::Qwen2Moe}};
  const std::string hint = "tessera converts GPT2LMHeadModel (model_type \"gpt2\"), LlamaForCausalLM (\"llama\"), "
                           "Qwen2ForCausalLM (\"qwen2\"), MixtralForCausalLM (\"mixtral\") and Qwen2MoeForCausalLM "
                           "(\"qwen2_moe\")";
  if (auto mt = j_.find("model_type"); mt != j_.end() && !mt->is_null()) {
    for (const auto& [name, f] : kModelTypes)
      if (mt->is_string() && *mt == name) return f;
    throw usage_error(path_ + ": model_type is " + mt->dump() + ", which tessera does not convert", hint);
  }
  if (auto a = j_.find("architectures"); a != j_.end() && a->is_array() && !a->empty()) {
    for (const auto& [name, f] : kArchitectures)
      if ((*a)[0].is_string() && (*a)[0] == name) return f;
    throw usage_error(path_ + ": architectures is " + a->dump() + ", which tessera does not convert", hint);
  }
  return HFFamily::GPT2;  // GPT2Config's files of old transformers versions name neither
}

bool HFConfigFile::has(const char* key) const {
  auto it = j_.find(key);
  return it != j_.end() && !it->is_null();
}

int64_t HFConfigFile::integer(const char* key) const {
  if (!has(key)) throw runtime_error(path_ + ": missing \"" + std::string(key) + "\"", "is this config.json complete?");
  return integer(key, 0);
}

int64_t HFConfigFile::integer(const char* key, int64_t dflt) const {
  if (!has(key)) return dflt;
  const nlohmann::json& v = j_.at(key);
  if (!v.is_number_integer() || v.get<int64_t>() <= 0 || v.get<int64_t>() > INT32_MAX)
    throw runtime_error(path_ + ": \"" + std::string(key) + "\" is " + v.dump() + ", expected a positive 32-bit integer");
  return v.get<int64_t>();
}

double HFConfigFile::number(const char* key, double dflt) const {
  if (!has(key)) return dflt;
  const nlohmann::json& v = j_.at(key);
  if (!v.is_number()) throw runtime_error(path_ + ": \"" + std::string(key) + "\" is " + v.dump() + ", not a number");
  return v.get<double>();
}

bool HFConfigFile::boolean(const char* key, bool dflt) const {
  if (!has(key)) return dflt;
  const nlohmann::json& v = j_.at(key);
  if (!v.is_boolean())
    throw runtime_error(path_ + ": \"" + std::string(key) + "\" is " + v.dump() + ", expected true or false");
  return v.get<bool>();
}

std::string HFConfigFile::string(const char* key, const std::string& dflt) const {
  if (!has(key)) return dflt;
  const nlohmann::json& v = j_.at(key);
  if (!v.is_string()) throw runtime_error(path_ + ": \"" + std::string(key) + "\" is " + v.dump() + ", not a string");
  return v.get<std::string>();
}

void HFConfigFile::unsupported(const char* key, const std::string& why, const std::string& hint) const {
  unsupported_value(key, j_.contains(key) ? j_.at(key) : nlohmann::json("absent"), why, hint);
}

void HFConfigFile::unsupported_value(const std::string& field, const nlohmann::json& value, const std::string& why,
                                     const std::string& hint) const {
  throw usage_error(path_ + ": " + field + " is " + value.dump() + ", " + why, hint);
}

void HFFlagCheck::equal(const char* key, int64_t hf, const char* flag, int64_t ours) {
  if (hf != ours)
    differ(std::string(key) + " is " + std::to_string(hf) + " but " + flag + " is " + std::to_string(ours),
           "pass " + std::string(flag) + " " + std::to_string(hf));
}

void HFFlagCheck::close(const char* key, double hf, const char* flag, float ours) {
  if (std::fabs(hf - ours) > 1e-5 * std::max(std::fabs(hf), std::fabs(double{ours})))
    differ(std::string(key) + " is " + hf_number(hf) + " but " + flag + " is " + hf_number(hf_decimal(ours)),
           "pass " + std::string(flag) + " " + hf_number(hf));
}

void HFFlagCheck::differ(const std::string& what, const std::string& fix) {
  what_.push_back(what);
  fixes_.push_back(fix);
}

void HFFlagCheck::done() const {
  if (what_.empty()) return;
  std::string message = cfg_.path() + ": ";
  if (what_.size() > 1) message += std::to_string(what_.size()) + " differences from the flags: ";
  for (size_t i = 0; i < what_.size(); ++i) message += (i ? "; " : "") + what_[i];
  // "pass A; pass B; drop C" as "pass A B; drop C".
  std::string pass, other;
  for (const std::string& f : fixes_) {
    if (f.starts_with("pass "))
      pass += (pass.empty() ? "pass " : " ") + f.substr(5);
    else
      other += "; " + f;
  }
  const std::string hint = pass.empty() ? other.substr(2) : pass + other;
  throw usage_error(message, hint + " to match the Hugging Face model");
}

HFWeights HFWeights::open(const std::string& dir, std::string prefix) {
  HFWeights w;
  w.prefix_ = std::move(prefix);
  const fs::path single = fs::path(dir) / "model.safetensors";
  const fs::path index = fs::path(dir) / "model.safetensors.index.json";
  if (fs::exists(single)) {
    w.label_ = single.string();
    w.readers_.push_back(safetensors::Reader::open(single.string()));
  } else if (fs::exists(index)) {
    // {"metadata": {...}, "weight_map": {"tensor name": "shard file name", ...}}
    w.label_ = index.string();
    const json j = read_json_object(index.string(), "");
    auto map = j.find("weight_map");
    if (map == j.end() || !map->is_object() || map->empty())
      throw runtime_error(index.string() + ": no \"weight_map\" object", "re-download or re-save the model");
    std::map<std::string, size_t> shard_of_file;
    for (const auto& [name, file] : map->items()) {
      if (!file.is_string() || file.get<std::string>().find('/') != std::string::npos)
        throw runtime_error(index.string() + ": weight_map maps " + name + " to " + file.dump() +
                            ", not a file name in the folder");
      if (shard_of_file.emplace(file.get<std::string>(), w.readers_.size()).second)
        w.readers_.push_back(safetensors::Reader::open((fs::path(dir) / file.get<std::string>()).string()));
    }
    for (const auto& [name, file] : map->items())
      if (!w.readers_[shard_of_file.at(file.get<std::string>())].contains(name))
        throw runtime_error(index.string() + ": weight_map puts " + name + " in " + file.get<std::string>() +
                                ", which does not hold it",
                            "the shards and the index disagree; re-download the model");
  } else {
    std::string hint = "save the model with save_pretrained(..., safe_serialization=True)";
    if (fs::exists(fs::path(dir) / "pytorch_model.bin") || fs::exists(fs::path(dir) / "pytorch_model.bin.index.json"))
      hint = "pytorch_model.bin (pickle) is never loaded; convert it to model.safetensors";
    throw usage_error(single.string() + ": not found (nor model.safetensors.index.json)", hint);
  }
  for (size_t r = 0; r < w.readers_.size(); ++r)
    for (const safetensors::TensorInfo& t : w.readers_[r].tensors())
      if (!w.index_.emplace(t.name, std::pair{r, &t}).second)
        throw runtime_error(w.label_ + ": tensor " + t.name + " is in two shards", "re-download the model");
  return w;
}

std::string HFWeights::resolve(const std::string& name) const {
  const std::string prefixed = prefix_ + name;
  const bool a = !prefix_.empty() && index_.count(prefixed) != 0, b = index_.count(name) != 0;
  if (a && b)
    throw runtime_error(label_ + ": holds both " + prefixed + " and " + name, "keep one of the two; the file is ambiguous");
  return a ? prefixed : b ? name : "";
}

std::vector<float> HFWeights::get(const std::string& name, const Shape& shape, const std::string& megatron) {
  const std::string file_name = resolve(name);
  if (file_name.empty())
    throw runtime_error(label_ + ": missing tensor " + name + (prefix_.empty() ? "" : " (or " + prefix_ + name + ")") +
                            ", expected shape " + shape_str(shape) + " for " + megatron,
                        "is this checkpoint the model config.json describes?");
  const auto& [reader, info] = index_.at(file_name);
  if (info->shape != shape)
    throw runtime_error(label_ + ": tensor " + file_name + " has shape " + shape_str(info->shape) +
                            " but the flags need " + shape_str(shape) + " (for " + megatron + ")",
                        "the tensor does not match config.json and the flags");
  read_.insert(file_name);
  return readers_[reader].read_f32(*info);
}

void HFWeights::check_all_read(const std::function<bool(std::string_view)>& ignorable, const std::string& model) const {
  for (const auto& [name, where] : index_) {
    if (read_.count(name) != 0 || ignorable(name)) continue;
    throw runtime_error(label_ + ": unexpected tensor " + name + " " + shape_str(where.second->shape) + " for " + model,
                        "is this checkpoint the model config.json and the flags describe?");
  }
}

const std::vector<float>& checkpoint_param(const std::map<std::string, std::vector<float>>& weights,
                                           const std::string& name, int64_t numel) {
  auto it = weights.find(name);
  if (it == weights.end()) throw runtime_error("export-hf: the checkpoint has no parameter " + name);
  if (static_cast<int64_t>(it->second.size()) != numel)
    throw runtime_error("export-hf: parameter " + name + " holds " + std::to_string(it->second.size()) +
                        " values, the model needs " + std::to_string(numel));
  return it->second;
}

void write_special_token_ids(nlohmann::json& config, const HFExportSpec& spec) {
  auto id = [](int64_t v) { return v >= 0 ? nlohmann::json(v) : nlohmann::json(nullptr); };
  config["bos_token_id"] = id(spec.bos_token_id);
  config["eos_token_id"] = id(spec.eos_token_id);
}

std::string hf_number(double v) {
  char buf[32];
  std::snprintf(buf, sizeof buf, "%.10g", v);
  return buf;
}

double hf_decimal(float v) {
  char buf[32];
  std::snprintf(buf, sizeof buf, "%.7g", static_cast<double>(v));
  return std::strtod(buf, nullptr);
}

std::vector<float> pad_rows(const std::vector<float>& w, int64_t padded, int64_t h) {
  std::vector<float> r(static_cast<size_t>(padded * h), 0.0f);
  std::copy(w.begin(), w.end(), r.begin());
  return r;
}

void check_param_list(const std::map<std::string, std::vector<float>>& weights, const GPTConfig& c,
                      const std::string& family) {
  const std::vector<ParamSpec> specs = gpt_param_specs(c);
  for (const ParamSpec& s : specs) {
    auto it = weights.find(s.name);
    if (it == weights.end())
      throw usage_error("--init-from-hf: a " + family + " checkpoint has no tensor for " + s.name + " " +
                            shape_str(s.shape),
                        "the flags describe a model " + family + " cannot initialise");
    int64_t n = 1;
    for (int64_t d : s.shape) n *= d;
    TESSERA_CHECK(static_cast<int64_t>(it->second.size()) == n,
                  s.name + ": converted " + std::to_string(it->second.size()) + " values for shape " + shape_str(s.shape));
  }
  TESSERA_CHECK(weights.size() == specs.size(), "the " + family + " conversion produced tensors the model does not have");
}

void check_vocab_fits(HFFlagCheck& check, const HFConfigFile& cfg, int64_t hf_vocab, const GPTConfig& c) {
  const char* path = cfg.path().c_str();
  if (hf_vocab > c.padded_vocab_size)
    check.differ("vocab_size " + std::to_string(hf_vocab) + " exceeds the padded vocabulary of " +
                     std::to_string(c.padded_vocab_size) + " rows",
                 "a tokenizer whose vocabulary covers the model's (--vocab-size or --tokenizer-type), or a larger "
                 "--make-vocab-size-divisible-by");
  else if (c.vocab_size > 0 && c.vocab_size > hf_vocab)
    log_warn("%s: vocab_size is %lld but the tokenizer's vocabulary is %d; embedding rows %lld..%d start at zero", path,
             static_cast<long long>(hf_vocab), c.vocab_size, static_cast<long long>(hf_vocab), c.vocab_size - 1);
  else if (c.vocab_size > 0 && c.vocab_size < hf_vocab)
    log_warn("%s: vocab_size is %lld but the tokenizer's vocabulary is %d; the tokenizer never produces the model's "
             "tokens %d..%lld",
             path, static_cast<long long>(hf_vocab), c.vocab_size, c.vocab_size, static_cast<long long>(hf_vocab - 1));
}

}  // namespace tessera
