// Hugging Face model folders, the parts shared by every family tessera converts (hf_gpt2.h,
// hf_llama.h; hf_export.h picks the family): config.json with typed fields whose errors name the file and the field, the
// family it declares, and the weights, as one model.safetensors or as the shards that
// model.safetensors.index.json maps, with the bookkeeping that makes a tensor nobody asked for
// an error (a different model, never silently half-loaded); and what an export writes.
// Nothing in the files is executed.
#pragma once

#include <cstdint>
#include <functional>
#include <map>
#include <set>
#include <string>
#include <string_view>
#include <vector>

#include <nlohmann/json.hpp>

#include "tessera/ckpt/safetensors.h"
#include "tessera/model/gpt_config.h"

namespace tessera {

// The model families tessera reads and writes, from config.json's model_type (or, without
// one, its architectures): GPT2LMHeadModel, LlamaForCausalLM, Qwen2ForCausalLM.
enum class HFFamily { GPT2, Llama, Qwen2, Mixtral, Qwen2Moe };
const char* hf_family_name(HFFamily f);  // "GPT-2", "Llama", "Qwen2", "Mixtral", "Qwen2-MoE"

class HFConfigFile {
 public:
  // Reads DIR/config.json; a missing file or invalid JSON is an error naming it.
  static HFConfigFile read(const std::string& dir);

  const std::string& path() const { return path_; }
  const nlohmann::json& json() const { return j_; }
  HFFamily family() const;

  // The field, or `dflt` when absent or null; a wrong type is an error naming the field.
  bool has(const char* key) const;
  int64_t integer(const char* key) const;  // required, a positive 32-bit integer
  int64_t integer(const char* key, int64_t dflt) const;
  double number(const char* key, double dflt) const;
  bool boolean(const char* key, bool dflt) const;
  std::string string(const char* key, const std::string& dflt) const;

  // A usage error "PATH: FIELD is VALUE, WHY" with `hint`; `field` may name a nested field
  // ("rope_scaling.rope_type").
  [[noreturn]] void unsupported(const char* key, const std::string& why, const std::string& hint) const;
  [[noreturn]] void unsupported_value(const std::string& field, const nlohmann::json& value, const std::string& why,
                                      const std::string& hint) const;

 private:
  std::string path_;
  nlohmann::json j_;
};

// The differences between config.json and the flags, gathered so that one usage error names
// them all, with one hint giving every flag that matches the model.
class HFFlagCheck {
 public:
  explicit HFFlagCheck(const HFConfigFile& cfg) : cfg_(cfg) {}
  // config.json's `key` is `hf` where `flag` gives `ours`; the fix is `flag hf`.
  void equal(const char* key, int64_t hf, const char* flag, int64_t ours);
  // The same to float precision (the flags hold floats).
  void close(const char* key, double hf, const char* flag, float ours);
  // Any other difference: what it is ("... but ..."), and the flags that fix it ("pass
  // --swiglu", "drop --rotary-percent").
  void differ(const std::string& what, const std::string& fix);
  // Throws the usage error when anything differs.
  void done() const;

 private:
  const HFConfigFile& cfg_;
  std::vector<std::string> what_, fixes_;
};

// The folder's tensors: DIR/model.safetensors, or every shard DIR/model.safetensors.index.json
// maps. Names are looked up with or without the family's `prefix` (GPT-2's "transformer.",
// Llama's "model."), as save_pretrained writes them for the LM-head model or its base model.
class HFWeights {
 public:
  static HFWeights open(const std::string& dir, std::string prefix);

  // The file's name for `name` (prefixed or bare), or "" when absent.
  std::string resolve(const std::string& name) const;
  bool contains(const std::string& name) const { return !resolve(name).empty(); }
  // Tensor `name` with exactly `shape`, as floats (F32, F16 and BF16); `megatron` names what it
  // becomes. A missing tensor or another shape is an error naming both.
  std::vector<float> get(const std::string& name, const Shape& shape, const std::string& megatron);
  // Throws naming the first tensor no get() read, unless `ignorable` (buffers such as GPT-2's
  // attention masks or RoPE's inv_freq) accepts its file name.
  void check_all_read(const std::function<bool(std::string_view)>& ignorable, const std::string& model) const;

 private:
  std::string label_;  // the file, or the index, for errors
  std::string prefix_;
  std::vector<safetensors::Reader> readers_;
  std::map<std::string, std::pair<size_t, const safetensors::TensorInfo*>> index_;  // name -> (reader, tensor)
  std::set<std::string> read_;
};

// What an export writes besides the weights.
struct HFExportSpec {
  GPTConfig model;
  int64_t bos_token_id = -1;  // -1: null (none)
  int64_t eos_token_id = -1;
  // The tokenizer's files, copied into OUT: name in OUT -> source path (GPT-2 BPE's vocab.json
  // and merges.txt; a HuggingFaceTokenizer folder's tokenizer.json and its companions).
  std::map<std::string, std::string> tokenizer_files;
};

// config.json's bos_token_id and eos_token_id (null for -1: an absent key would be the
// family's default, e.g. LlamaConfig's 1 and 2).
void write_special_token_ids(nlohmann::json& config, const HFExportSpec& spec);

// One tensor of an exported state dict.
struct HFTensor {
  std::string name;
  Shape shape;
  std::vector<float> data;
};

// Parameter `name` of a checkpoint's full weights, which must hold `numel` values (export-hf).
const std::vector<float>& checkpoint_param(const std::map<std::string, std::vector<float>>& weights,
                                           const std::string& name, int64_t numel);

// The float flag's value as the decimal it most likely was (1e-05, not 9.99999974737875e-06).
double hf_decimal(float v);
// v as a flag value or in a message: 10 significant digits, no trailing zeros (500000, 1e-05).
std::string hf_number(double v);

// The [rows, h] matrix `w` as the first rows of a zero [padded, h] one.
std::vector<float> pad_rows(const std::vector<float>& w, int64_t padded, int64_t h);

// Checks that `weights` holds exactly gpt_param_specs(c), each with its shape's size; `family`
// names the model in the error.
void check_param_list(const std::map<std::string, std::vector<float>>& weights, const GPTConfig& c,
                      const std::string& family);

// The vocabulary of config.json against the padded vocabulary of the flags: larger is a
// difference, a tokenizer vocabulary other than the model's only a warning.
void check_vocab_fits(HFFlagCheck& check, const HFConfigFile& cfg, int64_t hf_vocab, const GPTConfig& c);

}  // namespace tessera
