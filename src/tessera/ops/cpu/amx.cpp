#include "tessera/ops/cpu/amx.h"

#include <cstdint>

#if defined(__AMX_TILE__) && defined(__AMX_BF16__) && defined(__linux__)
#include <immintrin.h>
#include <sys/syscall.h>
#include <unistd.h>
#define TESSERA_AMX_TILES 1
#endif

namespace tessera::ops::cpu {

#if defined(TESSERA_AMX_TILES)

namespace {

constexpr int kArchReqXcompPerm = 0x1023, kXfeatureXtiledata = 18;  // Linux's asm/prctl.h

// ldtilecfg's 64-byte operand: palette 1, the tiles' rows and bytes per row.
struct alignas(64) TileConfig {
  uint8_t palette = 1, start_row = 0, reserved[14] = {};
  uint16_t colsb[16] = {};
  uint8_t rows[16] = {};
};

}  // namespace

bool amx_available() {
  static const bool granted = syscall(SYS_arch_prctl, kArchReqXcompPerm, kXfeatureXtiledata) == 0;
  return granted;
}

AmxScope::AmxScope() {
  TileConfig config;
  for (int t = 0; t < 8; ++t) config.colsb[t] = 64, config.rows[t] = 16;
  // Not _tile_loadconfig: GCC 12's names only 8 bytes of its operand as read, and the stores
  // of the rest were optimised away.
  asm volatile("ldtilecfg %0" ::"m"(config));
}
AmxScope::~AmxScope() { _tile_release(); }

#else

bool amx_available() { return false; }
AmxScope::AmxScope() {}
AmxScope::~AmxScope() {}

#endif

}  // namespace tessera::ops::cpu
