// The host-memory devices: 64-byte aligned host memory; every copy completes on return,
// so streams and events keep Device's no-op defaults.
#include <sys/mman.h>
#include <sys/sysinfo.h>

#include <algorithm>
#include <cstdint>
#include <cstdlib>
#include <cstring>
#include <string>

#include "tessera/core/error.h"
#include "tessera/device/cpu/cpu_device.h"

#if defined(__AVX512F__)
#include <immintrin.h>
#endif

namespace tessera {
namespace {

// Zeros n bytes at p, the 64-byte lines inside with streaming stores.
void zero_streaming(char* p, size_t n) {
#if defined(__AVX512F__)
  const size_t head = std::min(n, (64 - reinterpret_cast<uintptr_t>(p) % 64) % 64);
  std::memset(p, 0, head);
  size_t i = head;
  for (; i + 64 <= n; i += 64) _mm512_stream_si512(reinterpret_cast<__m512i*>(p + i), _mm512_setzero_si512());
  _mm_sfence();  // the streamed lines are visible before this thread reaches the loop's barrier
  std::memset(p + i, 0, n - i);
#else
  std::memset(p, 0, n);
#endif
}

// With TESSERA_HUGE_PAGES=1, slabs of at least kHugeMin bytes (parameters, gradients,
// optimizer state, activations) are 2 MiB-aligned and asked to be backed by transparent huge
// pages. Kernels stream them (AdamW reads 4 and writes 3 floats per parameter, the norm reads
// the gradient, GEMMs read cold weights): with 4 KiB pages every 4 KiB of each stream costs a
// TLB miss and stops the hardware prefetchers, which do not cross a page. Measured on the
// 2-core Sapphire Rapids VM: AdamW and the norm take 16 % less CPU time, a GPT-2 124M step
// 5-7 % less. It is opt-in, as PyTorch's THP_MEM_ALLOC_ENABLE is, because the first touch of
// huge pages can be slow: on that VM it added 10-25 s of system time to a GPT-2 124M start
// (the compaction counters did not move, so it was the first touch of guest memory itself),
// and where free 2 MiB blocks are scarce the kernel also compacts memory on that touch (THP
// defrag "madvise", the default), for every rank of a node at once.
constexpr size_t kHugePage = size_t(2) << 20, kHugeMin = size_t(32) << 20;

bool huge_pages_wanted() {  // TESSERA_HUGE_PAGES=1, read once
  static const bool wanted = [] {
    const char* v = std::getenv("TESSERA_HUGE_PAGES");
    return v && std::strcmp(v, "1") == 0;
  }();
  return wanted;
}

void* allocate_host(size_t bytes) {
  if (bytes < kHugeMin || !huge_pages_wanted()) return std::aligned_alloc(64, (bytes + 63) / 64 * 64);
  const size_t rounded = (bytes + kHugePage - 1) / kHugePage * kHugePage;
  void* p = std::aligned_alloc(kHugePage, rounded);
  if (p) madvise(p, rounded, MADV_HUGEPAGE);  // advice only: 4 KiB pages if refused
  return p;
}

class HostMemoryDevice : public Device {
 public:
  void* allocate(size_t bytes) override {
    refuse_while_capturing("allocate");
    if (bytes == 0) return nullptr;
    void* p = allocate_host(bytes);
    if (!p) {
      MemoryInfo m = memory_info();
      throw runtime_error("out of host memory: asked for " + std::to_string(bytes >> 20) +
                              " MiB with " + std::to_string(allocated_bytes() >> 20) +
                              " MiB in use by tessera and " + std::to_string(m.free_bytes >> 20) +
                              " MiB free on the machine",
                          "lower --micro-batch-size, enable --recompute-granularity, or split "
                          "the model with --tensor-model-parallel-size / "
                          "--pipeline-model-parallel-size");
    }
    account(static_cast<ptrdiff_t>(bytes));
    return p;
  }
  void free(void* ptr, size_t bytes) override {
    refuse_while_capturing("free");
    if (!ptr) return;
    std::free(ptr);
    account(-static_cast<ptrdiff_t>(bytes));
  }
  void copy_to_host(void* dst, const void* src, size_t src_offset, size_t bytes) override {
    refuse_while_capturing("copy_to_host");
    std::memcpy(dst, static_cast<const char*>(src) + src_offset, bytes);
  }
  void copy_from_host(void* dst, size_t dst_offset, const void* src, size_t bytes) override {
    refuse_while_capturing("copy_from_host");
    std::memcpy(static_cast<char*>(dst) + dst_offset, src, bytes);
  }
  void copy(void* dst, size_t dst_offset, const void* src, size_t src_offset, size_t bytes) override {
    std::memmove(static_cast<char*>(dst) + dst_offset, static_cast<const char*>(src) + src_offset, bytes);
  }
  // Gradient slabs are hundreds of MB: one memset per thread keeps both memory channels busy.
  // A fill larger than any cache streams its zeros past the caches: an ordinary store (and
  // glibc's memset, which streams only above a threshold derived from the reported L3, 480
  // MiB on the 2-core VM) reads every line before writing it. GPT-2 124M's 498 MB gradient
  // slab alone: 125 ms by memset, 49 ms streamed, at load 11.
  void fill_zero(void* dst, size_t dst_offset, size_t bytes) override {
    char* ptr = static_cast<char*>(dst) + dst_offset;
    constexpr size_t kChunk = size_t(1) << 20, kStreamMin = size_t(64) << 20;
    const int64_t chunks = static_cast<int64_t>((bytes + kChunk - 1) / kChunk);
    const bool stream = bytes >= kStreamMin;
#pragma omp parallel for schedule(static) if (chunks > 4)
    for (int64_t c = 0; c < chunks; ++c) {
      const size_t begin = static_cast<size_t>(c) * kChunk;
      if (stream)
        zero_streaming(ptr + begin, std::min(kChunk, bytes - begin));
      else
        std::memset(ptr + begin, 0, std::min(kChunk, bytes - begin));
    }
  }
  MemoryInfo memory_info() const override {
    struct sysinfo si {};
    sysinfo(&si);
    return {static_cast<size_t>(si.totalram) * si.mem_unit,
            static_cast<size_t>(si.freeram + si.bufferram) * si.mem_unit};
  }
  void synchronize(Stream) override { refuse_while_capturing("synchronize"); }
};

class CpuDevice final : public HostMemoryDevice {
 public:
  const char* backend_name() const override { return "cpu"; }
  std::string name() const override { return "cpu"; }
  bool is_host() const override { return true; }
};

class StrictDevice final : public HostMemoryDevice {
 public:
  const char* backend_name() const override { return "strict"; }
  std::string name() const override { return "strict"; }
  std::string description() const override { return "strict (host memory that refuses host access; a test device)"; }
  bool is_host() const override { return false; }
  // A "capture" runs the work and refuses what a CUDA graph could not replay: the tests'
  // proof that a region is capturable (device.h).
  Capture capture_support() const override { return Capture::CheckOnly; }
};

}  // namespace

Device& cpu_device() {
  static CpuDevice device;
  return device;
}

Device& strict_device() {
  static StrictDevice device;
  return device;
}

}  // namespace tessera
