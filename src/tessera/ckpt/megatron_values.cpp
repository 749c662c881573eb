#include "tessera/ckpt/megatron_values.h"

#include <cstring>

#include "tessera/ckpt/checkpoint.h"
#include "tessera/core/dtype.h"
#include "tessera/core/error.h"

namespace tessera::megatron {

using json = nlohmann::json;
using pickle::Kind;
using pickle::Value;

json to_json(const Value& v, int depth) {
  if (depth > 16) return nullptr;
  switch (v.kind) {
    case Kind::Bool: return v.boolean;
    case Kind::Int: return v.integer;
    case Kind::Float: return v.real;
    case Kind::Str: return v.text;
    case Kind::List:
    case Kind::Tuple: {
      json a = json::array();
      for (const Value* x : v.items) a.push_back(to_json(*x, depth + 1));
      return a;
    }
    case Kind::Dict: {
      json o = json::object();
      for (const auto& [k, x] : v.entries)
        if (k->kind == Kind::Str) o[k->text] = to_json(*x, depth + 1);
      return o;
    }
    case Kind::Global: return {{"$global", v.text}};
    case Kind::Object:
      if (v.items.size() == 1 && (v.items[0]->kind == Kind::Int || v.items[0]->kind == Kind::Str))
        return {{"$enum", v.text}, {v.integer == 1 ? "name" : "value", to_json(*v.items[0], depth + 1)}};
      return nullptr;
    default: return nullptr;
  }
}

Value* from_json(pickle::Document& doc, const json& j) {
  if (j.is_null()) return doc.none();
  if (j.is_boolean()) return doc.boolean(j.get<bool>());
  if (j.is_number_integer()) return doc.integer(j.get<int64_t>());
  if (j.is_number()) return doc.real(j.get<double>());
  if (j.is_string()) return doc.str(j.get<std::string>());
  if (j.is_array()) {
    std::vector<Value*> items;
    for (const json& x : j) items.push_back(from_json(doc, x));
    return doc.list(std::move(items));
  }
  if (j.contains("$global")) return doc.global(j.at("$global").get<std::string>());
  if (j.contains("$enum")) {
    const bool by_name = j.contains("name");
    Value* member = doc.object(j.at("$enum").get<std::string>(), {from_json(doc, j.at(by_name ? "name" : "value"))});
    member->integer = by_name ? 1 : 0;
    return member;
  }
  Value* d = doc.dict();
  for (const auto& [k, x] : j.items()) doc.set(d, k, from_json(doc, x));
  return d;
}

int arg_int(const json& args, const char* key, int fallback) {
  auto it = args.find(key);
  return it != args.end() && it->is_number_integer() ? it->get<int>() : fallback;
}

int64_t as_int(const Value* v, const TorchFile& f, const std::string& what) {
  if (v && v->kind == Kind::Int) return v->integer;
  if (v && v->kind == Kind::Float && v->real == static_cast<double>(static_cast<int64_t>(v->real)))
    return static_cast<int64_t>(v->real);
  if (v && v->kind == Kind::Tensor && v->tensor.shape.empty()) {
    std::vector<float> x = f.f32(v->tensor, what);
    return static_cast<int64_t>(x[0]);
  }
  throw runtime_error(f.path() + ": " + what + " is " + (v ? pickle::describe(*v) : "missing") + ", not an integer",
                      "the file is not a Megatron-LM checkpoint, or it is damaged");
}

double as_number(const Value* v, const TorchFile& f, const std::string& what) {
  if (v && v->kind == Kind::Float) return v->real;
  if (v && v->kind == Kind::Int) return static_cast<double>(v->integer);
  if (v && v->kind == Kind::Tensor && v->tensor.shape.empty()) return f.f32(v->tensor, what)[0];
  throw runtime_error(f.path() + ": " + what + " is " + (v ? pickle::describe(*v) : "missing") + ", not a number");
}

const Value* need(const Value* parent, std::string_view key, const TorchFile& f, Kind kind) {
  const Value* v = parent ? parent->get(key) : nullptr;
  if (!v || v->kind != kind)
    throw runtime_error(f.path() + ": '" + std::string(key) + "' is " + (v ? pickle::describe(*v) : "missing") +
                            (kind == Kind::Dict ? ", not a dict" : kind == Kind::List ? ", not a list" : ""),
                        "the file is not a Megatron-LM checkpoint of GPT, or it is damaged");
  return v;
}

namespace {

const char* storage_type_of(DType t) {
  switch (t) {
    case DType::BF16: return "BFloat16Storage";
    case DType::F16: return "HalfStorage";
    default: return "FloatStorage";
  }
}

// `numel` floats as a storage of `dtype` (rounded to bf16 / fp16, or copied).
std::vector<uint8_t> storage_bytes(const float* data, int64_t numel, DType dtype) {
  std::vector<uint8_t> bytes(static_cast<size_t>(numel) * dtype_size(dtype));
  for (int64_t i = 0; i < numel; ++i) {
    if (dtype == DType::BF16) {
      const uint16_t h = f32_to_bf16(data[i]);
      std::memcpy(&bytes[static_cast<size_t>(i) * 2], &h, 2);
    } else if (dtype == DType::F16) {
      const uint16_t h = f32_to_f16(data[i]);
      std::memcpy(&bytes[static_cast<size_t>(i) * 2], &h, 2);
    } else {
      std::memcpy(&bytes[static_cast<size_t>(i) * 4], &data[i], 4);
    }
  }
  return bytes;
}

}  // namespace

Value* FileTensors::add(const Tensor& t, DType dtype, const Shape& shape) {
  t.check_dtype(DType::F32);
  return record(storage_type_of(dtype), shape, [t, dtype] {
    std::vector<float> host(static_cast<size_t>(t.numel()));
    read_tensor_bytes(t, host.data());
    return storage_bytes(host.data(), t.numel(), dtype);
  });
}

Value* FileTensors::scalar(float v) {
  return record(storage_type_of(DType::F32), {}, [v] { return storage_bytes(&v, 1, DType::F32); });
}

Value* FileTensors::empty() {
  return record(storage_type_of(DType::F32), {0}, [] { return std::vector<uint8_t>(); });
}

Value* FileTensors::add_bytes(const std::vector<uint8_t>& bytes) {
  return record("ByteStorage", {static_cast<int64_t>(bytes.size())}, [bytes] { return bytes; });
}

Value* FileTensors::record(const char* storage_type, const Shape& shape, std::function<std::vector<uint8_t>()> bytes) {
  int64_t numel = 1;
  for (int64_t d : shape) numel *= d;
  const std::string key = std::to_string(storages_.size());
  pickle::TensorRef t{{key, storage_type, "cpu", numel}, 0, {shape.begin(), shape.end()}, {}};
  int64_t stride = 1;
  t.stride.resize(shape.size());
  for (size_t d = shape.size(); d-- > 0;) {
    t.stride[d] = stride;
    stride *= shape[d];
  }
  storages_.push_back({key, std::move(bytes)});
  return doc_.tensor(std::move(t));
}

}  // namespace tessera::megatron
