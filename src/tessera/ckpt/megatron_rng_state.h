// The generator states Megatron-LM saves as `rng_state` in model_optim_rng.pt
// (megatron/training/checkpointing.py get_rng_state) and restores on load unless
// --no-load-rng; its loader stops when the key is missing. tessera draws every random number
// from counter-based Philox streams keyed by --seed (dropout, initialisation), so it has no
// generator that advanced during training. It writes the states Megatron's seeding leaves
// (megatron/training/initialize.py _set_random_seed: seed + 100 * pipeline rank for Python's
// `random`, numpy and torch; megatron/core/tensor_parallel/random.py
// model_parallel_cuda_manual_seed for the CUDA generator and its tracker), byte for byte what
// those libraries' getstate functions return right after seeding.
#pragma once

#include <array>
#include <cstdint>
#include <string>
#include <utility>
#include <vector>

namespace tessera {

struct MegatronRngState {
  // random.getstate(): (3, the 624 words and the position, None).
  std::vector<uint32_t> python_words;  // 625 values
  // numpy.random.get_state(): ('MT19937', 624 words, position, has_gauss 0, gauss 0.0).
  std::vector<uint32_t> numpy_words;
  int numpy_position = 0;
  // torch.get_rng_state(): the CPU generator's 5056-byte state.
  std::vector<uint8_t> torch_cpu;
  // torch.cuda.get_rng_state(): the 16 bytes (seed, Philox offset) of the default CUDA
  // generator, and the tracker's states by name in the order Megatron adds them.
  std::vector<uint8_t> cuda;
  std::vector<std::pair<std::string, std::vector<uint8_t>>> tracker;
};

// The states of the rank at (tp_rank, pp_rank) of a run with --seed `seed`.
MegatronRngState megatron_rng_state(int64_t seed, int tp_rank, int pp_rank);

}  // namespace tessera
