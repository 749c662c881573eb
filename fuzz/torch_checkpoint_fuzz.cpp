// Fuzz target for the readers of Megatron-LM's checkpoint files: tessera::TorchFile (the zip
// container, zip_archive.h), the restricted pickle reader (pickle.h) and torch_dist's .metadata
// (dcp_metadata.h). Any byte string must either be read, with every tensor's elements inside its
// storage, or throw tessera::Error. Anything else (another exception, a sanitizer report, a
// crash, a leak) is a bug. Inputs that start with "PK" go to the zip reader, others to the pickle
// reader with torch.save's allow-list and to the .metadata parser with its own (seed it with a
// real .metadata: fuzz/corpus/dcp/).
//
// Built with AddressSanitizer and UndefinedBehaviorSanitizer (tests/ckpt_area/tests.cmake).
// With Clang it is a libFuzzer target (TESSERA_LIBFUZZER); otherwise main() below mutates
// built-in seeds (a PyTorch-format file and raw pickles) for a bounded time:
//   torch_checkpoint_fuzz [--seconds N] [--seed S] [--runs N] [--replay FILE] [FILE...]
#include <cstdint>
#include <cstdio>
#include <cstring>
#include <set>
#include <vector>

#include "tessera/ckpt/dcp_metadata.h"
#include "tessera/ckpt/pickle.h"
#include "tessera/ckpt/torch_file.h"
#include "tessera/core/error.h"

namespace pk = tessera::pickle;

namespace {

// Reads every tensor the document names, visiting each value once (hostile documents share
// values to build exponentially large trees).
void touch(const tessera::TorchFile& f, const pk::Value& v, std::set<const pk::Value*>& seen) {
  if (!seen.insert(&v).second) return;
  if (v.kind == pk::Kind::Tensor) {
    try {
      const std::string& type = v.tensor.storage.type;
      const bool floating = type == "FloatStorage" || type == "HalfStorage" || type == "BFloat16Storage" ||
                            type == "DoubleStorage";
      if (floating) f.f32(v.tensor, "fuzz");
      else f.i64(v.tensor, "fuzz");
    } catch (const tessera::Error&) {
    }
  }
  for (const pk::Value* x : v.items) touch(f, *x, seen);
  for (const auto& [k, x] : v.entries) touch(f, *x, seen);
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  try {
    if (size >= 2 && data[0] == 'P' && data[1] == 'K') {
      const tessera::TorchFile f = tessera::TorchFile::from_bytes("fuzz-input", std::vector<uint8_t>(data, data + size));
      std::set<const pk::Value*> seen;
      touch(f, f.root(), seen);
    } else {
      const pk::Document doc = pk::unpickle({data, size}, "fuzz-input");
      (void)pk::describe(*doc.root);
    }
  } catch (const tessera::Error&) {
    // The expected outcome for malformed input.
  }
  if (size >= 2 && data[0] == 'P' && data[1] == 'K') return 0;
  try {
    (void)tessera::parse_dcp_metadata({data, size}, "fuzz-input");
  } catch (const tessera::Error&) {
  }
  return 0;
}

#ifndef TESSERA_LIBFUZZER

#include <chrono>
#include <random>
#include <string>

#include "standalone_driver.h"

namespace {

// What torch.save (torch 2.6) and numpy write that the writer never emits: a state_dict()'s
// OrderedDict with BUILD {'_metadata': OrderedDict()}, a Parameter with Python attributes
// (_rebuild_parameter_with_state) over a tensor with its backward-hook OrderedDict, torch.Size,
// numpy 2's array reconstruction (the RNG state's).
std::vector<uint8_t> torch_save_constructs() {
  static const char kPickle[] =
      "\x80\x02}(X\x02\x00\x00\x00sdccollections\nOrderedDict\n)RX\x01\x00\x00\x00wctorch._utils\n_rebuild_tens"
      "or_v2\n((X\x07\x00\x00\x00storagectorch\nFloatStorage\nX\x01\x00\x00\x00" "0X\x03\x00\x00\x00" "cpuK\x02"
      "tQK\x00K\x02\x85K\x01\x85\x89" "ccollections\nOrderedDict\n)RtRs}X\x09\x00\x00\x00_metadataccollections"
      "\nOrderedDict\n)RsbX\x01\x00\x00\x00pctorch._utils\n_rebuild_parameter_with_state\n(ctorch._utils\n_rebu"
      "ild_tensor_v2\n((X\x07\x00\x00\x00storagectorch\nFloatStorage\nX\x01\x00\x00\x00" "0X\x03\x00\x00\x00"
      "cpuK\x02tQK\x00K\x02\x85K\x01\x85\x89" "ccollections\nOrderedDict\n)RtR\x88" "ccollections\nOrderedDict"
      "\n)R}tRX\x01\x00\x00\x00sctorch\nSize\nK\x02K\x03\x86\x85RX\x01\x00\x00\x00ncnumpy._core.multiarray\n_re"
      "construct\ncnumpy\nndarray\nK\x00\x85" "C\x01" "b\x87R(K\x01K\x02\x85" "cnumpy\ndtype\nX\x02\x00\x00\x00"
      "u4\x89\x88\x87R(K\x03X\x01\x00\x00\x00<NNNJ\xff\xff\xff\xffJ\xff\xff\xff\xffK\x00tb\x89" "C\x08" "123456"
      "78tbu.";
  return {kPickle, kPickle + sizeof kPickle - 1};
}

// A small checkpoint-like document: a Namespace with an enum and a dtype, an OrderedDict of
// tensors over storages of several types.
std::vector<std::vector<uint8_t>> builtin_seeds() {
  pk::Document doc;
  pk::Value* root = doc.dict();
  pk::Value* args = doc.object("argparse.Namespace");
  doc.set(args, "num_layers", doc.integer(2));
  doc.set(args, "lr", doc.real(1e-3));
  doc.set(args, "params_dtype", doc.global("torch.bfloat16"));
  doc.set(args, "model_type", doc.object("megatron.core.enums.ModelType", {doc.integer(1)}));
  doc.set(args, "data_path", doc.list({doc.str("a"), doc.str("b")}));
  doc.set(root, "args", args);
  doc.set(root, "checkpoint_version", doc.real(3.0));
  pk::Value* model = doc.dict();
  std::vector<tessera::TorchStorageBytes> storages;
  const char* types[] = {"FloatStorage", "BFloat16Storage", "LongStorage", "ByteStorage"};
  for (int i = 0; i < 4; ++i) {
    const size_t es = tessera::storage_element_size(types[i]);
    tessera::TorchStorageBytes s{std::to_string(i), std::vector<uint8_t>(6 * es)};
    for (size_t b = 0; b < s.bytes.size(); ++b) s.bytes[b] = static_cast<uint8_t>(b * 29 + i);
    storages.push_back(s);
    doc.set(model, "t" + std::to_string(i),
            doc.tensor({{s.key, types[i], "cpu", 6}, static_cast<int64_t>(i % 2), {i % 2 ? 5 : 2, i % 2 ? 1 : 3},
                        {i % 2 ? 1 : 3, 1}}));
  }
  doc.set(model, "x._extra_state", doc.none());
  doc.set(root, "model", model);
  doc.set(root, "enum_by_name", [&] {
    pk::Value* v = doc.object("megatron.core.rerun_state_machine.RerunMode", {doc.str("DISABLED")});
    v->integer = 1;
    return v;
  }());
  std::vector<std::vector<uint8_t>> seeds;
  seeds.push_back(torch_save_constructs());
  seeds.push_back(tessera::torch_file_bytes("archive", *root, storages));
  seeds.push_back(pk::dump(*root));
  seeds.push_back(pk::dump(*args));
  return seeds;
}

class Mutator {
 public:
  explicit Mutator(uint64_t seed) : rng_(seed) {}
  size_t below(size_t n) { return n == 0 ? 0 : std::uniform_int_distribution<size_t>(0, n - 1)(rng_); }

  void mutate(std::vector<uint8_t>& d, const std::vector<std::vector<uint8_t>>& pool) {
    static const uint8_t kInteresting[] = {0, 1, 0x7f, 0x80, 0xff, '(', ')', '.', 'R', 'b', 'c', 'q', 'h',
                                           'Q', 'X', 'J', 0x8a, 0x93, 0x81, 'u', 'e', 't', 0x85};
    switch (below(7)) {
      case 0:
        if (!d.empty()) d[below(d.size())] ^= static_cast<uint8_t>(1u << below(8));
        break;
      case 1:
        if (!d.empty()) d[below(d.size())] = kInteresting[below(sizeof kInteresting)];
        break;
      case 2:
        d.resize(below(d.size() + 1));
        break;
      case 3: {
        if (d.empty()) break;
        const size_t a = below(d.size()), n = 1 + below(std::min<size_t>(16, d.size() - a));
        d.erase(d.begin() + a, d.begin() + a + n);
        break;
      }
      case 4: {
        const size_t a = below(d.size() + 1), n = 1 + below(8);
        for (size_t i = 0; i < n; ++i) d.insert(d.begin() + a, static_cast<uint8_t>(below(256)));
        break;
      }
      case 5: {  // a 4-byte little-endian field (sizes, offsets, counts) set to an edge value
        static const uint32_t kEdges[] = {0, 1, 7, 0xffff, 0xffffffff, 0x7fffffff, 64, 4096};
        if (d.size() < 4) break;
        const uint32_t v = kEdges[below(std::size(kEdges))];
        std::memcpy(&d[below(d.size() - 3)], &v, 4);
        break;
      }
      case 6: {
        const std::vector<uint8_t>& o = pool[below(pool.size())];
        if (o.empty()) break;
        const size_t a = below(o.size()), n = 1 + below(std::min<size_t>(64, o.size() - a));
        d.insert(d.begin() + below(d.size() + 1), o.begin() + a, o.begin() + a + n);
        break;
      }
    }
  }

 private:
  std::mt19937_64 rng_;
};

}  // namespace

int main(int argc, char** argv) {
  const fuzz_driver::Args args = fuzz_driver::parse_args("torch_checkpoint_fuzz", argc, argv);
  if (args.replay) {
    const std::vector<uint8_t> d = fuzz_driver::read_file("torch_checkpoint_fuzz", *args.replay);
    LLVMFuzzerTestOneInput(d.data(), d.size());
    std::printf("torch_checkpoint_fuzz: replay finished without a failure\n");
    return 0;
  }
  std::vector<std::vector<uint8_t>> pool = builtin_seeds();
  for (const std::string& f : args.files) pool.push_back(fuzz_driver::read_file("torch_checkpoint_fuzz", f));
  std::printf("torch_checkpoint_fuzz: seed %llu, %zu seed inputs, %.0f s\n", static_cast<unsigned long long>(args.seed),
              pool.size(), args.seconds);
  std::fflush(stdout);
  // The built-in seeds must read cleanly: they are what the mutations start from.
  for (const std::vector<uint8_t>& s : builtin_seeds()) {
    try {
      if (s[0] == 'P') tessera::TorchFile::from_bytes("seed", s);
      else pk::unpickle(s, "seed");
    } catch (const tessera::Error& e) {
      std::fprintf(stderr, "torch_checkpoint_fuzz: a built-in seed does not read: %s\n", e.what());
      return 1;
    }
  }
  Mutator m(args.seed);
  const auto start = std::chrono::steady_clock::now();
  uint64_t runs = 0;
  std::vector<uint8_t> input;
  for (; runs < args.max_runs; ++runs) {
    if ((runs & 255) == 0 && std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count() >= args.seconds)
      break;
    input = pool[m.below(pool.size())];
    for (size_t k = 1 + m.below(4); k > 0; --k) m.mutate(input, pool);
    if (input.size() > (1u << 16)) input.resize(1u << 16);
    LLVMFuzzerTestOneInput(input.data(), input.size());
    if (pool.size() < 4096 && m.below(16) == 0) pool.push_back(input);
  }
  std::printf("torch_checkpoint_fuzz: %llu inputs, no failures\n", static_cast<unsigned long long>(runs));
  return 0;
}

#endif  // TESSERA_LIBFUZZER
