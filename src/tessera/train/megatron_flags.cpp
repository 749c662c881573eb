#include "tessera/train/megatron_flags.h"

namespace tessera {
namespace {

constexpr MegatronFlag kMegatronFlags[] = {
#define MEGATRON_FLAG(name, kind, default_literal, dest) {name, MegatronFlagKind::kind, default_literal, dest},
#include "tessera/train/megatron_flags.inc"
#undef MEGATRON_FLAG
};

}  // namespace

std::span<const MegatronFlag> megatron_flags() { return kMegatronFlags; }

const MegatronFlag* find_megatron_flag(std::string_view flag) {
  for (const MegatronFlag& f : kMegatronFlags)
    if (flag == f.name) return &f;
  return nullptr;
}

}  // namespace tessera
