#include "tessera/ckpt/pickle.h"

#include <cstring>
#include <map>
#include <set>

#include "tessera/core/error.h"

namespace tessera::pickle {
namespace {

// What an allowed global may be used as.
enum class Role {
  TensorRebuild,
  ParameterRebuild,
  ParameterWithStateRebuild,  // a Parameter with Python attributes (Megatron's tensor_model_parallel, ...)
  Size,                       // torch.Size(tuple): the tuple
  OrderedDict,
  Namespace,
  Enum,
  EnumByName,  // getattr(EnumClass, "member"): how Python 3.11+ pickles enum members
  Latin1Bytes,  // _codecs.encode(text, "latin1"): how protocol 2 pickles bytes (numpy's RNG state)
  NumpyData,
  Dtype,
  StorageType,
  DcpRecord,  // a dataclass of torch.distributed.checkpoint: NEWOBJ () + BUILD of its fields
  Layout,     // torch.serialization._get_layout("torch.strided"): the name
  Path,       // pathlib.PosixPath(*parts): the path
  BytesIO     // io.BytesIO under NEWOBJ () + BUILD of (contents, position, attributes): data
};

// torch.save's files (Megatron's model_optim_rng.pt, common.pt, a .distcp payload).
const std::map<std::string, Role>& torch_save_globals() {
  static const std::map<std::string, Role> kAllowed = [] {
    std::map<std::string, Role> m = {
        {"torch._utils._rebuild_tensor_v2", Role::TensorRebuild},
        {"torch._utils._rebuild_parameter", Role::ParameterRebuild},
        {"torch._utils._rebuild_parameter_with_state", Role::ParameterWithStateRebuild},
        {"torch.Size", Role::Size},
        {"collections.OrderedDict", Role::OrderedDict},
        {"argparse.Namespace", Role::Namespace},
        {"__builtin__.getattr", Role::EnumByName},
        {"builtins.getattr", Role::EnumByName},
        {"_codecs.encode", Role::Latin1Bytes},
        {"megatron.core.enums.ModelType", Role::Enum},
        {"megatron.core.rerun_state_machine.RerunMode", Role::Enum},
        {"megatron.core.rerun_state_machine.RerunState", Role::Enum},
        {"megatron.core.rerun_state_machine.RerunDiagnostic", Role::Enum},
        {"numpy.core.multiarray._reconstruct", Role::NumpyData},  // numpy 1
        {"numpy.core.multiarray.scalar", Role::NumpyData},
        {"numpy._core.multiarray._reconstruct", Role::NumpyData},  // numpy 2
        {"numpy._core.multiarray.scalar", Role::NumpyData},
        {"numpy.ndarray", Role::NumpyData},
        {"numpy.dtype", Role::NumpyData},
        {"_io.BytesIO", Role::BytesIO},  // Transformer Engine 1.x's _extra_state
    };
    for (const char* t : {"Float", "Double", "Half", "BFloat16", "Long", "Int", "Short", "Char", "Byte", "Bool"})
      m[std::string("torch.") + t + "Storage"] = Role::StorageType;
    for (const char* d : {"float32", "float64", "float16", "bfloat16", "int64", "int32", "int16", "int8", "uint8",
                          "bool", "float", "double", "half", "long", "int"})
      m[std::string("torch.") + d] = Role::Dtype;
    return m;
  }();
  return kAllowed;
}

// torch.distributed.checkpoint's .metadata (torch 2.5's metadata.py and filesystem.py, as
// megatron-core 0.10.0's torch_dist saves it): the Metadata dataclasses, torch.Size, dtypes,
// the layout and memory-format records of TensorProperties, StorageMeta's checkpoint path.
const std::map<std::string, Role>& dcp_metadata_globals() {
  static const std::map<std::string, Role> kAllowed = [] {
    const std::string dcp = "torch.distributed.checkpoint.metadata.";
    std::map<std::string, Role> m = {
        {"torch.distributed.checkpoint.filesystem._StorageInfo", Role::DcpRecord},
        {dcp + "_MEM_FORMAT_ENCODING", Role::Enum},
        {"builtins.getattr", Role::EnumByName},  // the member by name: Debian's Python 3.11.2 pickles it so
        {"torch.serialization._get_layout", Role::Layout},
        {"torch.Size", Role::Size},
        {"pathlib.PosixPath", Role::Path},
    };
    for (const char* c : {"Metadata", "TensorStorageMetadata", "TensorProperties", "ChunkStorageMetadata",
                          "BytesStorageMetadata", "MetadataIndex", "StorageMeta"})
      m[dcp + c] = Role::DcpRecord;
    for (const auto& [name, role] : torch_save_globals())
      if (role == Role::Dtype) m[name] = role;
    return m;
  }();
  return kAllowed;
}

Role role_of(const std::string& name, const std::string& label, Dialect dialect) {
  const std::map<std::string, Role>& allowed =
      dialect == Dialect::DcpMetadata ? dcp_metadata_globals() : torch_save_globals();
  auto it = allowed.find(name);
  if (it == allowed.end())
    throw runtime_error(label + ": the pickle names the global '" + name + "', which " +
                            (dialect == Dialect::DcpMetadata ? "a torch_dist .metadata" : "a Megatron checkpoint") +
                            " never holds; nothing was executed",
                        "the file is not a Megatron-LM checkpoint, or it has been tampered with; do not load it");
  return it->second;
}

// pickletools' names of the opcodes the reader takes, for messages.
const char* opcode_name(uint8_t op) {
  switch (op) {
    case 0x80: return "PROTO";
    case 0x95: return "FRAME";
    case '(': return "MARK";
    case '0': return "POP";
    case '1': return "POP_MARK";
    case '2': return "DUP";
    case 'N': return "NONE";
    case 0x88: return "NEWTRUE";
    case 0x89: return "NEWFALSE";
    case 'J': return "BININT";
    case 'K': return "BININT1";
    case 'M': return "BININT2";
    case 0x8a: return "LONG1";
    case 'G': return "BINFLOAT";
    case 'X': return "BINUNICODE";
    case 0x8c: return "SHORT_BINUNICODE";
    case 0x8d: return "BINUNICODE8";
    case 'T': return "BINSTRING";
    case 'U': return "SHORT_BINSTRING";
    case 'B': return "BINBYTES";
    case 'C': return "SHORT_BINBYTES";
    case 0x8e: return "BINBYTES8";
    case ']': return "EMPTY_LIST";
    case 'l': return "LIST";
    case 'a': return "APPEND";
    case 'e': return "APPENDS";
    case ')': return "EMPTY_TUPLE";
    case 't': return "TUPLE";
    case 0x85: return "TUPLE1";
    case 0x86: return "TUPLE2";
    case 0x87: return "TUPLE3";
    case '}': return "EMPTY_DICT";
    case 'd': return "DICT";
    case 's': return "SETITEM";
    case 'u': return "SETITEMS";
    case 'c': return "GLOBAL";
    case 0x93: return "STACK_GLOBAL";
    case 'R': return "REDUCE";
    case 0x81: return "NEWOBJ";
    case 'b': return "BUILD";
    case 'Q': return "BINPERSID";
    case 'q': return "BINPUT";
    case 'r': return "LONG_BINPUT";
    case 0x94: return "MEMOIZE";
    case 'h': return "BINGET";
    case 'j': return "LONG_BINGET";
    case '.': return "STOP";
    default: return "?";
  }
}

constexpr int kMaxDepth = 512;
constexpr size_t kMaxDims = 16;

class Unpickler {
 public:
  Unpickler(std::span<const uint8_t> in, const std::string& label, Dialect dialect)
      : in_(in), label_(label), dialect_(dialect) {}

  Document run() {
    while (true) {
      op_pos_ = pos_;
      op_ = take(1)[0];
      if (op_ == '.') break;
      step(op_);
    }
    if (stack_.size() != 1 || !marks_.empty()) fail("the pickle does not end with exactly one value");
    doc_.root = stack_.back();
    std::map<const Value*, int> color;
    check_acyclic(doc_.root, color, 0);
    return std::move(doc_);
  }

 private:
  // What the opcode at op_pos_ met, named; the file is blamed only when it ends early.
  [[noreturn]] void fail(const std::string& what) const {
    throw runtime_error(label_ + ": pickle opcode " + opcode_name(op_) + " at byte " + std::to_string(op_pos_) + ": " +
                            what + "; nothing was executed",
                        "tessera reads what torch.save writes for Megatron-LM's checkpoints (docs/checkpoints.md); "
                        "if a Megatron-LM or PyTorch release wrote this file, report it with the message");
  }
  [[noreturn]] void unsupported(const std::string& what) const {
    fail(std::string(opcode_name(op_)) + " " + what + " is not supported");
  }

  std::span<const uint8_t> take(uint64_t n) {
    if (n > in_.size() - pos_)
      throw runtime_error(label_ + ": the pickle ends early, at byte " + std::to_string(in_.size()) +
                              " inside opcode " + opcode_name(op_) + " (at byte " + std::to_string(op_pos_) + ")",
                          "the file is truncated; copy it again from its source");
    std::span<const uint8_t> s = in_.subspan(pos_, static_cast<size_t>(n));
    pos_ += static_cast<size_t>(n);
    return s;
  }
  uint64_t take_le(int bytes) {
    std::span<const uint8_t> s = take(bytes);
    uint64_t v = 0;
    for (int i = bytes - 1; i >= 0; --i) v = v << 8 | s[i];
    return v;
  }
  std::string take_line() {
    std::string s;
    while (true) {
      const char c = static_cast<char>(take(1)[0]);
      if (c == '\n') return s;
      if (s.size() > 256) fail("a name longer than 256 characters");
      s += c;
    }
  }

  Value* pop() {
    if (stack_.empty() || (!marks_.empty() && stack_.size() == marks_.back())) fail("pop from an empty stack");
    Value* v = stack_.back();
    stack_.pop_back();
    return v;
  }
  Value* top() {
    if (stack_.empty() || (!marks_.empty() && stack_.size() == marks_.back())) fail("no value on the stack");
    return stack_.back();
  }
  std::vector<Value*> pop_mark() {
    if (marks_.empty()) fail("no mark on the stack");
    std::vector<Value*> items(stack_.begin() + static_cast<std::ptrdiff_t>(marks_.back()), stack_.end());
    stack_.resize(marks_.back());
    marks_.pop_back();
    return items;
  }
  void push(Value* v) { stack_.push_back(v); }

  Value* as(Value* v, Kind kind, const char* what) {
    if (v->kind != kind) fail(std::string(what) + " expected, found " + describe(*v));
    return v;
  }

  void set_items(Value* target, const std::vector<Value*>& kv) {
    if (kv.size() % 2) fail("an odd number of dict items");
    if (target->kind != Kind::Dict) fail("items set on " + describe(*target));
    for (size_t i = 0; i < kv.size(); i += 2) doc_.set(target, kv[i], kv[i + 1]);
  }

  Value* global(const std::string& module, const std::string& name) {
    const std::string q = module + "." + name;
    const Role r = role_of(q, label_, dialect_);
    Value* g = doc_.global(q);
    g->integer = static_cast<int>(r);
    return g;
  }
  static Role role(const Value* g) { return static_cast<Role>(g->integer); }

  Value* persistent(Value* pid) {
    const std::vector<Value*>& t = as(pid, Kind::Tuple, "a persistent id tuple")->items;
    if (t.size() != 5 || !t[0]->is_str("storage") || t[1]->kind != Kind::Global || role(t[1]) != Role::StorageType ||
        t[2]->kind != Kind::Str || t[3]->kind != Kind::Str || t[4]->kind != Kind::Int || t[4]->integer < 0)
      fail("a persistent id other than ('storage', torch.<Type>Storage, key, location, numel): " + describe(*pid));
    Value* s = doc_.make(Kind::Storage);
    s->storage = {t[2]->text, t[1]->text.substr(6), t[3]->text, t[4]->integer};
    return s;
  }

  std::vector<int64_t> int_tuple(Value* v, const char* what) {
    std::vector<int64_t> out;
    for (Value* x : as(v, Kind::Tuple, what)->items) {
      if (x->kind != Kind::Int || x->integer < 0) fail(std::string(what) + " holds " + describe(*x));
      out.push_back(x->integer);
    }
    if (out.size() > kMaxDims) fail(std::string(what) + " has more than 16 dimensions");
    return out;
  }

  Value* reduce(Value* callable, Value* args_value) {
    if (callable->kind != Kind::Global) fail("REDUCE on " + describe(*callable));
    const std::vector<Value*>& args = as(args_value, Kind::Tuple, "an argument tuple")->items;
    switch (role(callable)) {
      case Role::TensorRebuild: {
        if (args.size() < 4 || args[0]->kind != Kind::Storage || args[1]->kind != Kind::Int || args[1]->integer < 0)
          fail("_rebuild_tensor_v2 with arguments " + describe(*args_value));
        TensorRef t{args[0]->storage, args[1]->integer, int_tuple(args[2], "a tensor size"),
                    int_tuple(args[3], "a tensor stride")};
        if (t.shape.size() != t.stride.size()) fail("a tensor's size and stride differ in length");
        return doc_.tensor(std::move(t));
      }
      case Role::ParameterRebuild:  // (data, requires_grad, backward_hooks)
      case Role::ParameterWithStateRebuild:  // (..., state): the Parameter's Python attributes, dropped
        if (args.size() != (role(callable) == Role::ParameterRebuild ? 3u : 4u) || args[0]->kind != Kind::Tensor ||
            args[1]->kind != Kind::Bool || args[2]->kind != Kind::Dict || !args[2]->entries.empty())
          fail(callable->text + " of " + describe(*args_value));
        return args[0];
      case Role::Size:
        if (args.size() != 1) fail("torch.Size of " + describe(*args_value));
        int_tuple(args[0], "a torch.Size");
        return args[0];
      case Role::OrderedDict: {
        if (!args.empty()) fail("OrderedDict called with arguments");
        Value* d = doc_.dict();
        d->text = "OrderedDict";
        return d;
      }
      case Role::Enum:
        if (args.size() != 1 || (args[0]->kind != Kind::Int && args[0]->kind != Kind::Str))
          fail(callable->text + " called with " + describe(*args_value));
        return doc_.object(callable->text, args);
      case Role::EnumByName: {
        if (args.size() != 2 || args[0]->kind != Kind::Global || role(args[0]) != Role::Enum ||
            args[1]->kind != Kind::Str)
          fail("getattr of anything but an allowed enum's member: " + describe(*args_value));
        Value* member = doc_.object(args[0]->text, {args[1]});
        member->integer = 1;
        return member;
      }
      case Role::Latin1Bytes: {
        if (args.size() != 2 || args[0]->kind != Kind::Str || !args[1]->is_str("latin1"))
          fail("_codecs.encode other than (text, 'latin1'): " + describe(*args_value));
        Value* bytes = doc_.make(Kind::Bytes);
        bytes->text = latin1_of_utf8(args[0]->text);
        return bytes;
      }
      case Role::NumpyData:
        return doc_.object(callable->text, args);
      case Role::Layout:
        if (args.size() != 1 || args[0]->kind != Kind::Str) fail("_get_layout of " + describe(*args_value));
        return args[0];
      case Role::Path: {
        std::string path;
        for (const Value* part : args) {
          if (part->kind != Kind::Str) fail("PosixPath of " + describe(*args_value));
          path += (path.empty() || path == "/" ? "" : "/") + part->text;
        }
        return doc_.str(path);
      }
      default:
        fail("the global " + callable->text + " called as a function");
    }
  }

  void step(uint8_t op) {
    switch (op) {
      case 0x80: take(1); break;                      // PROTO
      case 0x95: take(8); break;                      // FRAME
      case '(': marks_.push_back(stack_.size()); break;  // MARK
      case '0': pop(); break;                         // POP
      case '1': pop_mark(); break;                    // POP_MARK
      case '2': push(top()); break;                   // DUP
      case 'N': push(doc_.none()); break;
      case 0x88: push(doc_.boolean(true)); break;
      case 0x89: push(doc_.boolean(false)); break;
      case 'J': push(doc_.integer(static_cast<int32_t>(take_le(4)))); break;
      case 'K': push(doc_.integer(static_cast<int64_t>(take_le(1)))); break;
      case 'M': push(doc_.integer(static_cast<int64_t>(take_le(2)))); break;
      case 0x8a: {  // LONG1: little-endian two's complement of n bytes
        const uint64_t n = take_le(1);
        if (n > 8) fail("an integer wider than 64 bits");
        std::span<const uint8_t> b = take(n);
        uint64_t v = 0;
        for (int i = static_cast<int>(n) - 1; i >= 0; --i) v = v << 8 | b[i];
        if (n > 0 && n < 8 && (b[n - 1] & 0x80)) v |= ~uint64_t{0} << (8 * n);
        push(doc_.integer(static_cast<int64_t>(v)));
        break;
      }
      case 'G': {  // BINFLOAT, big-endian
        std::span<const uint8_t> b = take(8);
        uint64_t bits = 0;
        for (uint8_t x : b) bits = bits << 8 | x;
        double d;
        std::memcpy(&d, &bits, 8);
        push(doc_.real(d));
        break;
      }
      case 'X': push_text(Kind::Str, take_le(4)); break;
      case 0x8c: push_text(Kind::Str, take_le(1)); break;
      case 0x8d: push_text(Kind::Str, take_le(8)); break;
      case 'T': push_text(Kind::Bytes, take_le(4)); break;
      case 'U': push_text(Kind::Bytes, take_le(1)); break;
      case 'B': push_text(Kind::Bytes, take_le(4)); break;
      case 'C': push_text(Kind::Bytes, take_le(1)); break;
      case 0x8e: push_text(Kind::Bytes, take_le(8)); break;
      case ']': push(doc_.list()); break;
      case 'l': push(doc_.list(pop_mark())); break;
      case 'a': {
        Value* v = pop();
        as(top(), Kind::List, "a list")->items.push_back(v);
        break;
      }
      case 'e': {
        std::vector<Value*> items = pop_mark();
        Value* l = as(top(), Kind::List, "a list");
        l->items.insert(l->items.end(), items.begin(), items.end());
        break;
      }
      case ')': push(doc_.tuple({})); break;
      case 't': push(doc_.tuple(pop_mark())); break;
      case 0x85:
      case 0x86:
      case 0x87: {
        std::vector<Value*> items(op - 0x84);
        for (size_t i = items.size(); i-- > 0;) items[i] = pop();
        push(doc_.tuple(std::move(items)));
        break;
      }
      case '}': push(doc_.dict()); break;
      case 'd': {
        std::vector<Value*> kv = pop_mark();
        Value* d = doc_.dict();
        set_items(d, kv);
        push(d);
        break;
      }
      case 's': {
        Value* v = pop();
        Value* k = pop();
        set_items(top(), {k, v});
        break;
      }
      case 'u': {
        std::vector<Value*> kv = pop_mark();
        set_items(top(), kv);
        break;
      }
      case 'c': {
        const std::string module = take_line();
        const std::string name = take_line();
        push(global(module, name));
        break;
      }
      case 0x93: {  // STACK_GLOBAL
        Value* name = as(pop(), Kind::Str, "a global's name");
        Value* module = as(pop(), Kind::Str, "a global's module");
        push(global(module->text, name->text));
        break;
      }
      case 'R': {
        Value* args = pop();
        Value* callable = pop();
        push(reduce(callable, args));
        break;
      }
      case 0x81: {  // NEWOBJ: cls.__new__(cls, *args)
        Value* args = as(pop(), Kind::Tuple, "NEWOBJ's arguments");
        Value* cls = pop();
        if (cls->kind != Kind::Global ||
            (role(cls) != Role::Namespace && role(cls) != Role::NumpyData && role(cls) != Role::DcpRecord &&
             role(cls) != Role::BytesIO) ||
            ((role(cls) == Role::DcpRecord || role(cls) == Role::BytesIO) && !args->items.empty()))
          fail("NEWOBJ of " + describe(*cls));
        push(doc_.object(cls->text, args->items));
        break;
      }
      case 'b': {  // BUILD: the object's state
        Value* state = pop();
        build(top(), state);
        break;
      }
      case 'Q': push(persistent(pop())); break;
      case 'q': memo_[take_le(1)] = top(); break;
      case 'r': memo_[take_le(4)] = top(); break;
      case 0x94: memo_[memo_.size()] = top(); break;
      case 'h':
      case 'j': {
        const uint64_t key = take_le(op == 'h' ? 1 : 4);
        auto it = memo_.find(key);
        if (it == memo_.end()) fail("memo entry " + std::to_string(key) + " read before it is written");
        push(it->second);
        break;
      }
      default: {
        char hex[8];
        std::snprintf(hex, sizeof hex, "0x%02x", op);
        throw runtime_error(label_ + ": the pickle uses opcode " + hex + " at byte " + std::to_string(pos_ - 1) +
                                ", which a Megatron checkpoint never holds; nothing was executed",
                            "the file is not a PyTorch checkpoint of Megatron-LM, or it is damaged");
      }
    }
  }

  // An object's state: a Namespace's attributes, numpy's array data; on a dict, its instance
  // attributes (nn.Module.state_dict()'s OrderedDict carries `_metadata`, the modules' versions).
  void build(Value* obj, Value* state) {
    if (obj->kind == Kind::Dict) {
      if (state->kind != Kind::Dict || obj->state)
        unsupported("on " + describe(*obj) + " with the state " + describe(*state));
      obj->state = state;
      return;
    }
    if (obj->kind != Kind::Object) unsupported("on " + describe(*obj));
    if (obj->state || !obj->entries.empty()) unsupported("twice on " + describe(*obj));
    if (obj->text == "_io.BytesIO" &&
        (state->kind != Kind::Tuple || state->items.size() != 3 || state->items[0]->kind != Kind::Bytes ||
         state->items[1]->kind != Kind::Int))
      unsupported("on io.BytesIO with the state " + describe(*state));
    if (state->kind == Kind::Dict)
      obj->entries = state->entries;
    else
      obj->state = state;
  }

  // The code points (all below 256) of UTF-8 text as bytes.
  std::string latin1_of_utf8(const std::string& s) {
    std::string out;
    for (size_t i = 0; i < s.size(); ++i) {
      const auto c = static_cast<unsigned char>(s[i]);
      if (c < 0x80) {
        out += static_cast<char>(c);
      } else if ((c & 0xE0) == 0xC0 && c <= 0xC3 && i + 1 < s.size() && (s[i + 1] & 0xC0) == 0x80) {
        out += static_cast<char>(((c & 0x1F) << 6) | (static_cast<unsigned char>(s[++i]) & 0x3F));
      } else {
        fail("latin-1 bytes holding a code point above 255");
      }
    }
    return out;
  }

  void push_text(Kind kind, uint64_t n) {
    std::span<const uint8_t> b = take(n);
    Value* v = doc_.make(kind);
    v->text.assign(reinterpret_cast<const char*>(b.data()), b.size());
    push(v);
  }

  // 0 unvisited, 1 on the current path, 2 done.
  void check_acyclic(const Value* v, std::map<const Value*, int>& color, int depth) {
    if (depth > kMaxDepth) fail("values nested more than 512 deep");
    int& c = color[v];
    if (c == 2) return;
    if (c == 1) fail("a value that contains itself");
    c = 1;
    for (const Value* x : v->items) check_acyclic(x, color, depth + 1);
    for (const auto& [k, x] : v->entries) {
      check_acyclic(k, color, depth + 1);
      check_acyclic(x, color, depth + 1);
    }
    if (v->state) check_acyclic(v->state, color, depth + 1);
    color[v] = 2;
  }

  std::span<const uint8_t> in_;
  size_t pos_ = 0;
  size_t op_pos_ = 0;  // where the opcode being run starts
  uint8_t op_ = 0;
  const std::string& label_;
  Dialect dialect_;
  Document doc_;
  std::vector<Value*> stack_;
  std::vector<size_t> marks_;
  std::map<uint64_t, Value*> memo_;
};

// ---- Writer --------------------------------------------------------------------------------

class Pickler {
 public:
  std::vector<uint8_t> run(const Value& root) {
    out_ = {0x80, 2};
    write(root);
    out_.push_back('.');
    return std::move(out_);
  }

 private:
  void byte(uint8_t b) { out_.push_back(b); }
  void le(uint64_t v, int n) {
    for (int i = 0; i < n; ++i) byte(static_cast<uint8_t>(v >> (8 * i)));
  }
  void text(std::string_view s) { out_.insert(out_.end(), s.begin(), s.end()); }
  void str(std::string_view s) {
    byte('X');
    le(s.size(), 4);
    text(s);
  }
  void global(std::string_view qualified) {
    const size_t dot = qualified.rfind('.');
    byte('c');
    text(qualified.substr(0, dot));
    byte('\n');
    text(qualified.substr(dot + 1));
    byte('\n');
  }
  void integer(int64_t v) {
    if (v >= 0 && v < 256) {
      byte('K');
      le(static_cast<uint64_t>(v), 1);
    } else if (v >= 0 && v < 65536) {
      byte('M');
      le(static_cast<uint64_t>(v), 2);
    } else if (v >= INT32_MIN && v <= INT32_MAX) {
      byte('J');
      le(static_cast<uint32_t>(v), 4);
    } else {
      byte(0x8a);
      byte(8);
      le(static_cast<uint64_t>(v), 8);
    }
  }
  void tuple(const std::vector<const Value*>& items) {
    if (items.empty()) return byte(')');
    if (items.size() > 3) byte('(');
    for (const Value* v : items) write(*v);
    byte(items.size() > 3 ? 't' : static_cast<uint8_t>(0x84 + items.size()));
  }
  void entries(const std::vector<std::pair<Value*, Value*>>& kv) {
    if (kv.empty()) return;
    byte('(');
    for (const auto& [k, v] : kv) {
      write(*k);
      write(*v);
    }
    byte('u');
  }

  void write(const Value& v) {
    switch (v.kind) {
      case Kind::None: return byte('N');
      case Kind::Bool: return byte(v.boolean ? 0x88 : 0x89);
      case Kind::Int: return integer(v.integer);
      case Kind::Float: {
        byte('G');
        uint64_t bits;
        std::memcpy(&bits, &v.real, 8);
        for (int i = 7; i >= 0; --i) byte(static_cast<uint8_t>(bits >> (8 * i)));
        return;
      }
      case Kind::Str: return str(v.text);
      case Kind::List:
        byte(']');
        if (v.items.empty()) return;
        byte('(');
        for (const Value* x : v.items) write(*x);
        return byte('e');
      case Kind::Tuple: return tuple({v.items.begin(), v.items.end()});
      case Kind::Dict:
        byte('}');
        return entries(v.entries);
      case Kind::Global: return global(v.text);
      case Kind::Object:
        if (v.integer == 1) {  // an enum member by name: getattr(Class, name)
          global("__builtin__.getattr");
          global(v.text);
          write(*v.items.at(0));
          byte(0x86);
          return byte('R');
        }
        global(v.text);
        if (v.items.empty()) {  // copyreg.__newobj__: NEWOBJ, then BUILD (Namespace, DCP's dataclasses)
          byte(')');
          byte(0x81);
          if (v.state) {
            write(*v.state);  // TensorProperties' __setstate__ tuple
          } else {
            byte('}');
            entries(v.entries);
          }
          return byte('b');
        }
        tuple({v.items.begin(), v.items.end()});  // Class(*args): an enum member, torch.Size, ...
        return byte('R');
      case Kind::Tensor: {
        const TensorRef& t = v.tensor;
        global("torch._utils._rebuild_tensor_v2");
        byte('(');
        global_storage(t.storage);
        integer(t.storage_offset);
        int_tuple(t.shape);
        int_tuple(t.stride);
        byte(0x89);  // requires_grad
        global("collections.OrderedDict");
        byte(')');
        byte('R');
        byte('t');
        return byte('R');
      }
      case Kind::Bytes: {  // protocol 2's bytes: _codecs.encode(the bytes as code points, 'latin1')
        global("_codecs.encode");
        std::string code_points;
        for (const char c : v.text) {
          const auto b = static_cast<unsigned char>(c);
          if (b < 0x80) {
            code_points += static_cast<char>(b);
          } else {
            code_points += static_cast<char>(0xC0 | (b >> 6));
            code_points += static_cast<char>(0x80 | (b & 0x3F));
          }
        }
        str(code_points);
        str("latin1");
        byte(0x86);
        return byte('R');
      }
      case Kind::Storage:
        break;
    }
    throw runtime_error("pickle writer: cannot write a " + describe(v));
  }
  void int_tuple(const std::vector<int64_t>& xs) {
    byte('(');
    for (int64_t x : xs) integer(x);
    byte('t');
  }
  void global_storage(const StorageRef& s) {  // BINPERSID ('storage', type, key, location, numel)
    byte('(');
    str("storage");
    global("torch." + s.type);
    str(s.key);
    str(s.location);
    integer(s.numel);
    byte('t');
    byte('Q');
  }

  std::vector<uint8_t> out_;
};

}  // namespace

const Value* Value::get(std::string_view key) const {
  for (auto it = entries.rbegin(); it != entries.rend(); ++it)
    if (it->first->kind == Kind::Str && it->first->text == key) return it->second;
  return nullptr;
}

Value* Document::make(Kind kind) {
  arena_.push_back(std::make_unique<Value>());
  arena_.back()->kind = kind;
  return arena_.back().get();
}
Value* Document::boolean(bool b) {
  Value* v = make(Kind::Bool);
  v->boolean = b;
  return v;
}
Value* Document::integer(int64_t i) {
  Value* v = make(Kind::Int);
  v->integer = i;
  return v;
}
Value* Document::real(double d) {
  Value* v = make(Kind::Float);
  v->real = d;
  return v;
}
Value* Document::str(std::string s) {
  Value* v = make(Kind::Str);
  v->text = std::move(s);
  return v;
}
Value* Document::global(std::string qualified_name) {
  Value* v = make(Kind::Global);
  v->text = std::move(qualified_name);
  return v;
}
Value* Document::list(std::vector<Value*> items) {
  Value* v = make(Kind::List);
  v->items = std::move(items);
  return v;
}
Value* Document::tuple(std::vector<Value*> items) {
  Value* v = make(Kind::Tuple);
  v->items = std::move(items);
  return v;
}
Value* Document::dict() { return make(Kind::Dict); }
// A repeated key is kept; get() returns the last one, as a Python dict would hold it.
void Document::set(Value* d, Value* key, Value* value) { d->entries.emplace_back(key, value); }
Value* Document::object(std::string qualified_class, std::vector<Value*> args) {
  Value* v = make(Kind::Object);
  v->text = std::move(qualified_class);
  v->items = std::move(args);
  return v;
}
Value* Document::tensor(TensorRef t) {
  Value* v = make(Kind::Tensor);
  v->tensor = std::move(t);
  return v;
}

Document unpickle(std::span<const uint8_t> bytes, const std::string& label, Dialect dialect) {
  return Unpickler(bytes, label, dialect).run();
}

std::vector<uint8_t> dump(const Value& root) { return Pickler().run(root); }

namespace {
// Nested values are described three levels deep at most (hostile input nests arbitrarily).
std::string describe_at(const Value& v, int depth) {
  if (depth > 3) return "...";
  switch (v.kind) {
    case Kind::None: return "None";
    case Kind::Bool: return v.boolean ? "True" : "False";
    case Kind::Int: return std::to_string(v.integer);
    case Kind::Float: return std::to_string(v.real);
    case Kind::Str: return "'" + v.text.substr(0, 60) + "'";
    case Kind::Bytes: return "bytes(" + std::to_string(v.text.size()) + ")";
    case Kind::List: return "list(" + std::to_string(v.items.size()) + ")";
    case Kind::Tuple: {
      std::string s = "(";
      for (size_t i = 0; i < v.items.size() && i < 8; ++i) s += (i ? ", " : "") + describe_at(*v.items[i], depth + 1);
      return s + (v.items.size() > 8 ? ", ...)" : ")");
    }
    case Kind::Dict: return (v.text.empty() ? "dict(" : v.text + "(") + std::to_string(v.entries.size()) + ")";
    case Kind::Global: return "global " + v.text;
    case Kind::Object:
      if (v.items.size() == 1 && v.items[0]->kind != Kind::Object) return v.text + "(" + describe_at(*v.items[0], depth + 1) + ")";
      return v.text + " object";
    case Kind::Storage: return "storage " + v.storage.type + " '" + v.storage.key + "'";
    case Kind::Tensor: {
      std::string s = "tensor [";
      for (size_t i = 0; i < v.tensor.shape.size(); ++i) s += (i ? ", " : "") + std::to_string(v.tensor.shape[i]);
      return s + "]";
    }
  }
  return "?";
}

}  // namespace

std::string describe(const Value& v) { return describe_at(v, 0); }

}  // namespace tessera::pickle
