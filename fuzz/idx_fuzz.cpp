// Fuzz target for tessera::data::parse_index, the `.idx` parser behind IndexedDataset: any byte
// string must either give a view whose every count, pointer and document index is consistent
// and whose every sequence lies inside the .bin, or throw tessera::Error. Anything else (another
// exception, a sanitizer report, a crash, a failed consistency check) is a bug.
//
// Input layout: byte 0-1 little-endian = .bin size in bytes (bit 15: parse as multimodal), the
// rest = the .idx file. The .bin is a heap buffer of exactly that size, and every token of every
// sequence is read from it, so AddressSanitizer sees any out-of-bounds access.
//
// tests/data_area/tests.cmake builds it with clang++ -fsanitize=fuzzer,address,undefined
// (TESSERA_LIBFUZZER; run `idx_fuzz -max_total_time=55 fuzz/corpus/idx`) or, without libFuzzer,
// with the host compiler and the standalone mutation driver below:
//   idx_fuzz [--seconds N] [--seed S] [FILE...]
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <memory>
#include <vector>

#include "tessera/core/error.h"
#include "tessera/data/index_format.h"

namespace td = tessera::data;

#define FUZZ_CHECK(cond)                                                        \
  do {                                                                          \
    if (!(cond)) {                                                              \
      std::fprintf(stderr, "idx_fuzz: check failed: %s (line %d)\n", #cond, __LINE__); \
      std::abort();                                                             \
    }                                                                           \
  } while (0)

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  if (size < 2) return 0;
  const uint64_t bin_size = (data[0] | (uint64_t(data[1]) << 8)) & 0x7FFF;
  td::IndexParseOptions options;
  options.multimodal = (data[1] & 0x80) != 0;
  // Exact-size heap copies so that any overread is an ASan report.
  std::unique_ptr<unsigned char[]> idx(new unsigned char[size - 2]);
  std::memcpy(idx.get(), data + 2, size - 2);
  std::unique_ptr<unsigned char[]> bin(new unsigned char[bin_size + 1]);
  std::memset(bin.get(), 0xA5, bin_size + 1);
  try {
    td::IndexView v = td::parse_index({idx.get(), size - 2}, bin_size, "fuzz.idx", "fuzz.bin", options);
    const uint64_t item = td::dtype_size(v.dtype);
    FUZZ_CHECK(item >= 1 && item <= 8);
    FUZZ_CHECK(v.document_index_count >= 1);
    volatile unsigned sink = 0;
    for (uint64_t i = 0; i < v.sequence_count; ++i) {
      int32_t len = v.length(i);
      int64_t ptr = v.pointer(i);
      FUZZ_CHECK(len >= 0 && ptr >= 0);
      FUZZ_CHECK(static_cast<uint64_t>(ptr) + static_cast<uint64_t>(len) * item <= bin_size);
      for (uint64_t b = 0; b < static_cast<uint64_t>(len) * item; ++b) sink = sink + bin[static_cast<uint64_t>(ptr) + b];
      if (v.modes) sink = sink + v.modes[i];
    }
    int64_t prev = 0;
    for (uint64_t i = 0; i < v.document_index_count; ++i) {
      int64_t d = v.document_index(i);
      FUZZ_CHECK(d >= prev && static_cast<uint64_t>(d) <= v.sequence_count);
      prev = d;
    }
    FUZZ_CHECK(static_cast<uint64_t>(prev) == v.sequence_count);
  } catch (const tessera::Error&) {
    // The expected outcome for malformed input.
  }
  return 0;
}

#ifndef TESSERA_LIBFUZZER

#include <chrono>
#include <fstream>
#include <iterator>
#include <random>
#include <string>

namespace {

std::vector<uint8_t> le64(uint64_t v) {
  std::vector<uint8_t> b(8);
  std::memcpy(b.data(), &v, 8);
  return b;
}

// The indexed-dataset worked example of docs/data.md, prefixed with its .bin size (10).
std::vector<uint8_t> example_seed() {
  std::vector<uint8_t> s = {10, 0};
  const char magic[9] = {'M', 'M', 'I', 'D', 'I', 'D', 'X', 0, 0};
  s.insert(s.end(), magic, magic + 9);
  auto add = [&](const std::vector<uint8_t>& b) { s.insert(s.end(), b.begin(), b.end()); };
  add(le64(1));
  s.push_back(8);
  add(le64(2));
  add(le64(3));
  for (int32_t len : {3, 2}) {
    uint8_t b[4];
    std::memcpy(b, &len, 4);
    s.insert(s.end(), b, b + 4);
  }
  add(le64(0));
  add(le64(6));
  for (uint64_t d : {0, 1, 2}) add(le64(d));
  return s;
}

// Mutations that keep the structure interesting: counts, pointers and lengths set to edge
// values, as well as byte flips, insertions, deletions and truncations.
void mutate(std::vector<uint8_t>& s, std::mt19937_64& rng) {
  static const uint64_t edges[] = {0, 1, 2, 3, 7, 8, 0x7F, 0xFF, 0x7FFF, 0xFFFF, 0x7FFFFFFF, 0x80000000,
                                   0xFFFFFFFF, 0x7FFFFFFFFFFFFFFFull, 0x8000000000000000ull, ~0ull};
  int n = 1 + static_cast<int>(rng() % 4);
  for (int k = 0; k < n; ++k) {
    switch (rng() % 7) {
      case 0:
        if (!s.empty()) s[rng() % s.size()] ^= static_cast<uint8_t>(1u << (rng() % 8));
        break;
      case 1:
        if (!s.empty()) s[rng() % s.size()] = static_cast<uint8_t>(rng());
        break;
      case 2:
        if (!s.empty()) s.resize(rng() % (s.size() + 1));
        break;
      case 3:
        s.insert(s.begin() + static_cast<long>(rng() % (s.size() + 1)), static_cast<uint8_t>(rng()));
        break;
      case 4:
        if (!s.empty()) s.erase(s.begin() + static_cast<long>(rng() % s.size()));
        break;
      default:
        if (s.size() >= 8) {  // an 8-byte field (count, pointer, index) or a 4-byte length
          size_t at = rng() % (s.size() - 7);
          uint64_t v = edges[rng() % (sizeof(edges) / sizeof(edges[0]))];
          std::memcpy(s.data() + at, &v, (rng() & 1) ? 8 : 4);
        }
    }
  }
}

}  // namespace

int main(int argc, char** argv) {
  double seconds = 55;
  uint64_t seed = 1;
  std::vector<std::vector<uint8_t>> pool = {example_seed()};
  for (int i = 1; i < argc; ++i) {
    std::string a = argv[i];
    if (a == "--seconds" && i + 1 < argc) seconds = std::stod(argv[++i]);
    else if (a == "--seed" && i + 1 < argc) seed = std::stoull(argv[++i]);
    else if (a.rfind("-", 0) == 0) {
      std::printf("usage: idx_fuzz [--seconds N] [--seed S] [FILE...]\n");
      return 2;
    } else {
      std::ifstream f(a, std::ios::binary);
      pool.emplace_back(std::istreambuf_iterator<char>(f), std::istreambuf_iterator<char>());
    }
  }
  std::mt19937_64 rng(seed);
  auto start = std::chrono::steady_clock::now();
  uint64_t runs = 0;
  while (std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count() < seconds) {
    for (int k = 0; k < 256; ++k) {
      std::vector<uint8_t> s = pool[rng() % pool.size()];
      mutate(s, rng);
      LLVMFuzzerTestOneInput(s.data(), s.size());
      if (pool.size() < 4096 && rng() % 64 == 0) pool.push_back(std::move(s));
      ++runs;
    }
  }
  std::printf("idx_fuzz: %llu inputs in %.0f s, no failure\n", static_cast<unsigned long long>(runs), seconds);
  return 0;
}

#endif
