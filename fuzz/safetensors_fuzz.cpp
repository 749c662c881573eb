// Fuzz target for tessera::safetensors::Reader: any byte string must either parse into tensors
// whose every byte lies inside the input, or throw tessera::Error. Anything else (another
// exception, a sanitizer report, a crash) is a bug.
//
// Built with AddressSanitizer and UndefinedBehaviorSanitizer (tests/ckpt_area/tests.cmake).
// With Clang it is a libFuzzer target (TESSERA_LIBFUZZER): run `safetensors_fuzz
// -max_total_time=30`. With other compilers main() below is a standalone driver that mutates
// seed files for a bounded time, structure-aware (header length, numbers and dtype strings in
// the JSON header) as well as byte-level:
//   safetensors_fuzz [--seconds N] [--seed S] [--runs N] [FILE...]
// FILEs (e.g. real .safetensors files) join the built-in seeds. On a crash the current input is
// written to safetensors-fuzz-crash.bin in the working directory; replay it with
// `safetensors_fuzz --replay FILE`.
#include <cstdint>
#include <cstdio>
#include <cstring>
#include <vector>

#include "tessera/ckpt/safetensors.h"
#include "tessera/core/error.h"

namespace st = tessera::safetensors;

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  try {
    st::Reader r = st::Reader::from_bytes("fuzz-input", std::vector<uint8_t>(data, data + size));
    // Touch every byte the reader hands out, so ASan sees any out-of-bounds span.
    volatile uint8_t sink = 0;
    for (const st::TensorInfo& t : r.tensors()) {
      std::span<const uint8_t> b = r.bytes(t);
      for (uint8_t x : b) sink = sink ^ x;
      try {
        if (t.dtype == tessera::DType::F32 || t.dtype == tessera::DType::F16 || t.dtype == tessera::DType::BF16) {
          if (r.read_f32(t).size() != t.numel) __builtin_trap();
        } else {
          r.read_i64(t);
        }
      } catch (const tessera::Error&) {
      }
      if (r.find(t.name) == nullptr) __builtin_trap();
    }
    for (const auto& [k, v] : r.metadata()) sink = sink ^ static_cast<uint8_t>(k.size() + v.size());
  } catch (const tessera::Error&) {
    // The expected outcome for malformed input.
  }
  return 0;
}

#ifndef TESSERA_LIBFUZZER

#include <fcntl.h>
#include <signal.h>
#include <unistd.h>

#include <chrono>
#include <random>
#include <string>

#include "standalone_driver.h"

namespace {

const std::vector<uint8_t>* g_current = nullptr;
const char kCrashFile[] = "safetensors-fuzz-crash.bin";

// Async-signal-safe: saves the input being tested, then dies with the same signal.
void on_fatal_signal(int sig) {
  if (g_current) {
    int fd = ::open(kCrashFile, O_WRONLY | O_CREAT | O_TRUNC, 0644);
    if (fd >= 0) {
      ssize_t ignored = ::write(fd, g_current->data(), g_current->size());
      (void)ignored;
      ::close(fd);
    }
    const char msg[] = "safetensors_fuzz: crashing input written to safetensors-fuzz-crash.bin\n";
    ssize_t ignored = ::write(2, msg, sizeof msg - 1);
    (void)ignored;
  }
  signal(sig, SIG_DFL);
  raise(sig);
}

std::vector<uint8_t> file_bytes(const std::string& header, size_t data_bytes) {
  std::vector<uint8_t> out(8);
  uint64_t n = header.size();
  std::memcpy(out.data(), &n, 8);
  out.insert(out.end(), header.begin(), header.end());
  for (size_t i = 0; i < data_bytes; ++i) out.push_back(static_cast<uint8_t>(i * 37 + 11));
  return out;
}

std::vector<std::vector<uint8_t>> builtin_seeds() {
  std::vector<std::vector<uint8_t>> seeds;
  float f[6] = {1, -2, 3.5f, 0, 1e-3f, 7};
  uint16_t h[4] = {0x3c00, 0xc000, 0x7c00, 0x0001};
  int32_t i32[3] = {1, -1, 7};
  int64_t i64[2] = {-5, 1LL << 40};
  uint8_t u8[5] = {0, 1, 2, 254, 255};
  seeds.push_back(st::serialize({{"w", tessera::DType::F32, {2, 3}, f}}));
  seeds.push_back(st::serialize(
      {{"a.weight", tessera::DType::F32, {6}, f},
       {"b", tessera::DType::BF16, {2, 2}, h},
       {"c", tessera::DType::F16, {4}, h},
       {"d", tessera::DType::I32, {3}, i32},
       {"e", tessera::DType::I64, {2}, i64},
       {"f", tessera::DType::U16, {1, 4}, h},
       {"g", tessera::DType::U8, {5}, u8},
       {"scalar", tessera::DType::F32, {}, f},
       {"empty", tessera::DType::F32, {0, 3}, f}},
      {{"format", "pt"}, {"note", "seed"}}));
  seeds.push_back(file_bytes("{}      ", 0));
  seeds.push_back(file_bytes(R"({"x":{"dtype":"F64","shape":[2],"data_offsets":[0,16]},"y":{"dtype":"BOOL","shape":[3],"data_offsets":[16,19]}})", 19));
  seeds.push_back(file_bytes(R"({"__metadata__":{"k":"v"},"t\u00e9":{"dtype":"F8_E4M3","shape":[1,1],"data_offsets":[0,1]}})", 1));
  return seeds;
}

const char* const kNumbers[] = {"0", "1", "2", "7", "8", "-1", "-0", "255", "256", "65536",
                                "4294967295", "4294967296", "9223372036854775807",
                                "9223372036854775808", "18446744073709551615",
                                "18446744073709551616", "99999999999999999999999", "1.5", "1e3",
                                "1e309", "2.0", "null", "true", "\"3\"", "[]", "{}"};
const char* const kStrings[] = {"F32", "F16", "BF16", "I32", "I64", "U16", "U8", "F64", "BOOL",
                                "I8", "U64", "F8_E5M2", "", "f32", "F31", "__metadata__",
                                "dtype", "shape", "data_offsets"};
const uint64_t kLengths[] = {0, 1, 2, 7, 8, 100'000'000, 100'000'001, UINT64_MAX,
                             UINT64_MAX - 7, 1ULL << 63, 0xffffffffULL};

class Mutator {
 public:
  explicit Mutator(uint64_t seed) : rng_(seed) {}

  size_t below(size_t n) { return n == 0 ? 0 : std::uniform_int_distribution<size_t>(0, n - 1)(rng_); }

  void mutate(std::vector<uint8_t>& d, const std::vector<std::vector<uint8_t>>& pool) {
    switch (below(10)) {
      case 0:  // bit flip
        if (!d.empty()) d[below(d.size())] ^= static_cast<uint8_t>(1u << below(8));
        break;
      case 1: {  // interesting byte
        static const uint8_t v[] = {0, 1, 0x7f, 0x80, 0xff, '{', '}', '[', ']', '"', ',', ':', '-', '9', '\\'};
        if (!d.empty()) d[below(d.size())] = v[below(sizeof v)];
        break;
      }
      case 2:  // truncate
        d.resize(below(d.size() + 1));
        break;
      case 3: {  // delete a range
        if (d.empty()) break;
        size_t a = below(d.size()), n = 1 + below(std::min<size_t>(16, d.size() - a));
        d.erase(d.begin() + a, d.begin() + a + n);
        break;
      }
      case 4: {  // insert random bytes
        size_t a = below(d.size() + 1), n = 1 + below(8);
        for (size_t i = 0; i < n; ++i) d.insert(d.begin() + a, static_cast<uint8_t>(below(256)));
        break;
      }
      case 5: {  // header length field
        if (d.size() < 8) d.resize(8);
        uint64_t n = below(3) == 0 ? d.size() - 8 - below(16) : kLengths[below(std::size(kLengths))];
        std::memcpy(d.data(), &n, 8);
        break;
      }
      case 6: replace_token(d, /*number=*/true); break;
      case 7: replace_token(d, /*number=*/false); break;
      case 8: {  // splice a chunk of another input
        const std::vector<uint8_t>& o = pool[below(pool.size())];
        if (o.empty()) break;
        size_t a = below(o.size()), n = 1 + below(std::min<size_t>(64, o.size() - a));
        size_t at = below(d.size() + 1);
        d.insert(d.begin() + at, o.begin() + a, o.begin() + a + n);
        break;
      }
      case 9: {  // grow or shrink the data section
        if (below(2)) d.resize(d.size() + below(64), 0x5a);
        else d.resize(d.size() - below(std::min<size_t>(d.size(), 64) + 1));
        break;
      }
    }
  }

 private:
  // Replaces a number (or a quoted string) inside the JSON header and usually fixes the
  // header length so the mutation reaches the validation code behind the JSON parser.
  void replace_token(std::vector<uint8_t>& d, bool number) {
    if (d.size() < 9) return;
    uint64_t n;
    std::memcpy(&n, d.data(), 8);
    if (n > d.size() - 8) return;
    std::string header(d.begin() + 8, d.begin() + 8 + n);
    std::vector<std::pair<size_t, size_t>> spans;  // [begin, end) of candidate tokens
    for (size_t i = 0; i < header.size();) {
      if (number && (isdigit(static_cast<unsigned char>(header[i])) || header[i] == '-')) {
        size_t j = i + 1;
        while (j < header.size() && (isdigit(static_cast<unsigned char>(header[j])) || header[j] == '.' ||
                                     header[j] == 'e'))
          ++j;
        spans.push_back({i, j});
        i = j;
      } else if (!number && header[i] == '"') {
        size_t j = header.find('"', i + 1);
        if (j == std::string::npos) break;
        spans.push_back({i + 1, j});
        i = j + 1;
      } else {
        ++i;
      }
    }
    if (spans.empty()) return;
    auto [a, b] = spans[below(spans.size())];
    std::string with = number ? kNumbers[below(std::size(kNumbers))] : kStrings[below(std::size(kStrings))];
    header.replace(a, b - a, with);
    std::vector<uint8_t> out(8);
    uint64_t len = below(8) ? header.size() : n;
    std::memcpy(out.data(), &len, 8);
    out.insert(out.end(), header.begin(), header.end());
    out.insert(out.end(), d.begin() + 8 + n, d.end());
    d = std::move(out);
  }

  std::mt19937_64 rng_;
};

}  // namespace

int main(int argc, char** argv) {
  const fuzz_driver::Args args = fuzz_driver::parse_args("safetensors_fuzz", argc, argv);
  if (args.replay) {
    std::vector<uint8_t> d = fuzz_driver::read_file("safetensors_fuzz", *args.replay);
    LLVMFuzzerTestOneInput(d.data(), d.size());
    std::printf("safetensors_fuzz: replay finished without a failure\n");
    return 0;
  }
  std::vector<std::vector<uint8_t>> pool = builtin_seeds();
  for (const std::string& f : args.files) pool.push_back(fuzz_driver::read_file("safetensors_fuzz", f));
  for (int sig : {SIGABRT, SIGSEGV, SIGBUS, SIGILL, SIGFPE, SIGTRAP}) signal(sig, on_fatal_signal);
  std::printf("safetensors_fuzz: seed %llu, %zu seed inputs, %.0f s\n", static_cast<unsigned long long>(args.seed),
              pool.size(), args.seconds);
  std::fflush(stdout);

  Mutator m(args.seed);
  const auto start = std::chrono::steady_clock::now();
  const size_t kMaxInputs = 4096, kMaxLen = 1 << 16;
  uint64_t runs = 0, accepted = 0;
  std::vector<uint8_t> input;
  g_current = &input;
  for (; runs < args.max_runs; ++runs) {
    if ((runs & 255) == 0 &&
        std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count() >= args.seconds)
      break;
    input = pool[m.below(pool.size())];
    for (size_t k = 1 + m.below(4); k > 0; --k) m.mutate(input, pool);
    if (input.size() > kMaxLen) input.resize(kMaxLen);
    LLVMFuzzerTestOneInput(input.data(), input.size());
    // Inputs that still parse are kept as new seeds: they reach the validation code.
    try {
      st::Reader::from_bytes("fuzz-input", input);
      ++accepted;
      if (pool.size() < kMaxInputs) pool.push_back(input);
      else pool[m.below(pool.size())] = input;
    } catch (const tessera::Error&) {
    }
  }
  g_current = nullptr;
  std::printf("safetensors_fuzz: %llu inputs, %llu parsed, %llu rejected with an Error, no failures\n",
              static_cast<unsigned long long>(runs), static_cast<unsigned long long>(accepted),
              static_cast<unsigned long long>(runs - accepted));
  return 0;
}

#endif  // TESSERA_LIBFUZZER
