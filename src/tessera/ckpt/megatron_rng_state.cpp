#include "tessera/ckpt/megatron_rng_state.h"

#include <cstring>

#include "tessera/core/error.h"
#include "tessera/core/mt19937.h"

namespace tessera {
namespace {

template <class T>
void put(std::vector<uint8_t>& out, size_t at, T value) {
  std::memcpy(out.data() + at, &value, sizeof value);
}

// torch's CPUGeneratorImplState (aten/src/ATen/CPUGeneratorImpl.cpp): the legacy
// THGeneratorState (initial seed u64, left i32, seeded i32, next u64, 624 words as u64, the
// Box-Muller cache as 3 doubles and an int) then the float normal cache, 5056 bytes in all.
// torch.manual_seed(s) seeds MT19937 with init_genrand(s mod 2^32) and keeps s itself.
std::vector<uint8_t> torch_cpu_state(uint64_t seed) {
  constexpr size_t kBytes = 5056, kWords = 24;
  const Mt19937RandomState mt(static_cast<uint32_t>(seed));
  std::vector<uint8_t> out(kBytes, 0);
  put<uint64_t>(out, 0, seed);
  put<int32_t>(out, 8, 1);   // left: the next draw regenerates
  put<int32_t>(out, 12, 1);  // seeded
  put<uint64_t>(out, 16, 0);  // next
  for (size_t i = 0; i < mt.key().size(); ++i) put<uint64_t>(out, kWords + 8 * i, mt.key()[i]);
  return out;
}

// torch.cuda.manual_seed(s); torch.cuda.get_rng_state(): the seed and a Philox offset of 0.
std::vector<uint8_t> cuda_state(uint64_t seed) {
  std::vector<uint8_t> out(16, 0);
  put<uint64_t>(out, 0, seed);
  return out;
}

}  // namespace

MegatronRngState megatron_rng_state(int64_t seed, int tp_rank, int pp_rank) {
  TESSERA_CHECK(seed > 0, "Megatron seeds its generators only for --seed > 0");
  const uint64_t s = static_cast<uint64_t>(seed) + 100ULL * static_cast<uint64_t>(pp_rank);
  MegatronRngState state;

  Mt19937RandomState python(0);
  const uint32_t words[2] = {static_cast<uint32_t>(s), static_cast<uint32_t>(s >> 32)};
  python.seed_by_array(std::span<const uint32_t>(words, s >> 32 ? 2 : 1));
  state.python_words.assign(python.key().begin(), python.key().end());
  state.python_words.push_back(static_cast<uint32_t>(python.position()));

  const Mt19937RandomState numpy(static_cast<uint32_t>(s));
  state.numpy_words.assign(numpy.key().begin(), numpy.key().end());
  state.numpy_position = numpy.position();

  state.torch_cpu = torch_cpu_state(s);
  const uint64_t tp = static_cast<uint64_t>(tp_rank);
  state.cuda = cuda_state(s);
  state.tracker = {{"data-parallel-rng", cuda_state(s)},
                   {"model-parallel-rng", cuda_state(s + 2718 + tp)},
                   {"expert-parallel-rng", cuda_state(s + 1024 + tp)}};
  return state;
}

}  // namespace tessera
