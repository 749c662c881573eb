// A restricted Python pickle reader and a protocol-2 writer, for the `data.pkl` of PyTorch
// checkpoint files (Megatron-LM's model_optim_rng.pt).
//
// The reader executes nothing. It builds a tree of plain values and accepts only the globals a
// Megatron checkpoint holds, each in the one role it has there (docs/checkpoints.md lists where
// each was seen in files torch 2.6 and megatron-core 0.10.0 write):
//   - torch._utils._rebuild_tensor_v2 under REDUCE: a tensor record (storage, offset, shape,
//     strides; requires_grad and an empty backward-hook OrderedDict), whose storage is a
//     persistent id ('storage', torch.<Type>Storage, key, location, numel);
//     _rebuild_parameter (data, requires_grad, hooks) and _rebuild_parameter_with_state (...,
//     the Parameter's Python attributes, dropped): the tensor; torch.Size(tuple): the tuple;
//   - collections.OrderedDict under REDUCE: a dict, and BUILD on it sets its instance
//     attributes (state_dict()'s `_metadata`), kept as the dict's `state`;
//     argparse.Namespace under NEWOBJ + BUILD: an object holding its attributes;
//   - torch dtypes (torch.float32, ...) as data, and Megatron's enums as data:
//     megatron.core.enums.ModelType and megatron.core.rerun_state_machine.RerunMode /
//     RerunState / RerunDiagnostic, pickled as Class(value) or (Python 3.11+)
//     builtins.getattr(Class, "member"): class name and value or member name, nothing
//     constructed and getattr accepted for nothing else;
//   - numpy's array reconstruction records of the saved RNG state (numpy.core.multiarray.
//     _reconstruct, numpy.ndarray, numpy.dtype, numpy.core.multiarray.scalar; numpy 2 spells
//     the module numpy._core.multiarray), as data, and
//     _codecs.encode(text, 'latin1'), protocol 2's spelling of bytes, as the bytes;
//   - _io.BytesIO under NEWOBJ () + BUILD of (contents, position, attributes): Transformer
//     Engine 1.x's `_extra_state` (torch.save of its fp8 metadata, or of None), as data.
// torch_dist's `.metadata` (torch.distributed.checkpoint's Metadata, as megatron-core 0.10.0 and
// torch 2.5 pickle it, protocol 4) is read with its own allow-list, Dialect::DcpMetadata, and no
// other: the dataclasses Metadata, TensorStorageMetadata, TensorProperties, ChunkStorageMetadata,
// BytesStorageMetadata, MetadataIndex, StorageMeta (torch.distributed.checkpoint.metadata) and
// filesystem._StorageInfo under NEWOBJ () + BUILD (their fields, or TensorProperties' state
// tuple); torch.Size; torch dtypes; torch.serialization._get_layout("torch.strided") as the
// name; metadata._MEM_FORMAT_ENCODING(n) or builtins.getattr(_MEM_FORMAT_ENCODING, "name") as an
// enum member (Python versions differ in which they write); pathlib.PosixPath(*parts) as the
// path text. Each was seen in pickletools' listing of files megatron-core 0.10.0 wrote.
// Anything else (os.system, builtins.eval, a class whose __reduce__ would run code, an opcode
// outside the binary protocols) is a tessera::Error naming the global or opcode, its byte
// offset, what it met and the file; only a file that ends early is called truncated.
// Every length is checked against the input, values live in an arena (no reference cycles
// leak), and a cyclic or too deeply nested result is refused.
#pragma once

#include <cstdint>
#include <memory>
#include <span>
#include <string>
#include <string_view>
#include <vector>

namespace tessera::pickle {

enum class Kind { None, Bool, Int, Float, Str, Bytes, List, Tuple, Dict, Global, Object, Storage, Tensor };

// A persistent storage reference: data/<key> of the zip, `numel` elements of `type`
// ("FloatStorage", "BFloat16Storage", ...).
struct StorageRef {
  std::string key, type, location;
  int64_t numel = 0;
};

// torch._utils._rebuild_tensor_v2(storage, storage_offset, size, stride, ...).
struct TensorRef {
  StorageRef storage;
  int64_t storage_offset = 0;
  std::vector<int64_t> shape, stride;
};

struct Value {
  Kind kind = Kind::None;
  bool boolean = false;
  int64_t integer = 0;
  double real = 0;
  std::string text;  // Str / Bytes: the contents; Global / Object: the qualified class name;
                     // Dict: "OrderedDict" for one, else empty
  std::vector<Value*> items;                       // List, Tuple; Object: its constructor arguments
  std::vector<std::pair<Value*, Value*>> entries;  // Dict; Object: its attributes (BUILD's dict)
  Value* state = nullptr;                          // Object: BUILD's state when it is not a dict
                                                   // (an enum member: integer 1 when items[0] is its name);
                                                   // Dict: its attributes (state_dict()'s _metadata)
  StorageRef storage;                              // Storage
  TensorRef tensor;                                // Tensor

  // The entry of a Dict (or attribute of an Object) with this string key; nullptr if none.
  const Value* get(std::string_view key) const;
  bool is_str(std::string_view s) const { return kind == Kind::Str && text == s; }
};

// A tree of values owned by one arena.
class Document {
 public:
  Value* root = nullptr;

  Value* make(Kind kind);
  Value* none() { return make(Kind::None); }
  Value* boolean(bool b);
  Value* integer(int64_t i);
  Value* real(double d);
  Value* str(std::string s);
  Value* global(std::string qualified_name);
  Value* list(std::vector<Value*> items = {});
  Value* tuple(std::vector<Value*> items);
  Value* dict();
  // Appends key -> value to a Dict or an Object's attributes.
  void set(Value* dict_or_object, Value* key, Value* value);
  void set(Value* dict_or_object, std::string key, Value* value) { set(dict_or_object, str(std::move(key)), value); }
  // An argparse.Namespace, or an enum member (class, (value,)).
  Value* object(std::string qualified_class, std::vector<Value*> args = {});
  Value* tensor(TensorRef t);

 private:
  std::vector<std::unique_ptr<Value>> arena_;
};

// Which globals a pickle may name: torch.save's (Megatron's files) or a torch_dist .metadata's.
enum class Dialect { TorchSave, DcpMetadata };

// Parses `bytes` (the pickle of file `label`, named in errors).
Document unpickle(std::span<const uint8_t> bytes, const std::string& label, Dialect dialect = Dialect::TorchSave);

// Protocol 2, as torch.save writes: dicts, lists, tuples, scalars, strings, bytes (as
// _codecs.encode(text, 'latin1')), globals (torch
// dtypes), objects (without arguments: NEWOBJ + BUILD of their attributes or `state`, as a
// Namespace or DCP's dataclasses; with arguments: Class(*args) via REDUCE, as an enum member or
// torch.Size), tensors as _rebuild_tensor_v2 records over persistent storage ids.
std::vector<uint8_t> dump(const Value& root);

// "OrderedDict", "[3, 4]", "argparse.Namespace(...)": a short description for messages.
std::string describe(const Value& v);

}  // namespace tessera::pickle
