// The pieces of Megatron-LM's torch.save files that megatron_checkpoint.cpp and
// megatron_optimizer_state.cpp share: pickled values as JSON and back, checked accessors whose
// errors name the file, and the tensors of a file being written (each copied to the host only
// when the writer reaches it).
#pragma once

#include <cstdint>
#include <functional>
#include <string>
#include <string_view>
#include <vector>

#include <nlohmann/json.hpp>

#include "tessera/ckpt/pickle.h"
#include "tessera/ckpt/torch_file.h"
#include "tessera/core/tensor.h"

namespace tessera::megatron {

// A pickled value as JSON: a torch dtype is {"$global": "torch.bfloat16"}, an enum member
// {"$enum": "megatron.core.enums.ModelType", "value": 1}; what has no JSON form is null.
nlohmann::json to_json(const pickle::Value& v, int depth = 0);
// The inverse of to_json, into doc.
pickle::Value* from_json(pickle::Document& doc, const nlohmann::json& j);

// The Namespace attribute `key` (args as JSON) if it is an integer, else fallback.
int arg_int(const nlohmann::json& args, const char* key, int fallback);

// An integer (or an integral float, or a 0-d tensor) of f; an Error naming f and `what` else.
int64_t as_int(const pickle::Value* v, const TorchFile& f, const std::string& what);
double as_number(const pickle::Value* v, const TorchFile& f, const std::string& what);
// parent[key], which must be of `kind`; an Error naming f and the key else.
const pickle::Value* need(const pickle::Value* parent, std::string_view key, const TorchFile& f, pickle::Kind kind);

// Tensors of one file being written and where their storages' bytes come from.
class FileTensors {
 public:
  explicit FileTensors(pickle::Document& doc) : doc_(doc) {}

  // F32 tensor t saved as `dtype` (rounded to bf16 / fp16, or copied) in `shape` (t's elements
  // in order): its host copy is made when the writer reaches its storage.
  pickle::Value* add(const Tensor& t, DType dtype, const Shape& shape);
  pickle::Value* scalar(float v);
  // torch.Tensor(): an empty float32 tensor.
  pickle::Value* empty();
  // A 1-D torch.ByteTensor (a generator's state).
  pickle::Value* add_bytes(const std::vector<uint8_t>& bytes);
  const std::vector<TorchStorageSource>& storages() const { return storages_; }

 private:
  // A contiguous tensor over a storage of its own.
  pickle::Value* record(const char* storage_type, const Shape& shape, std::function<std::vector<uint8_t>()> bytes);

  pickle::Document& doc_;
  std::vector<TorchStorageSource> storages_;
};

}  // namespace tessera::megatron
