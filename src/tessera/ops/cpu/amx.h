// What every AMX kernel of the CPU backend needs before it touches a tile register (the fused
// attention's bf16 products, flash_attention_amx.cpp; the linear's GEMMs, amx_gemm.cpp).
#pragma once

namespace tessera::ops::cpu {

// Whether this process may run bf16 products on AMX: the build targets AMX-BF16 and Linux
// granted the tile data state (arch_prctl ARCH_REQ_XCOMP_PERM, asked once). Where it is false
// the kernels take their other path (AVX512-BF16's VDPBF16PS alone runs at the f32 FMA rate
// on Sapphire Rapids: no gain there).
bool amx_available();

// The tile registers' configuration of the calling thread (AMX keeps it per thread): every
// tile 16 rows of 64 bytes while this lives, released after.
struct AmxScope {
  AmxScope();
  ~AmxScope();
  AmxScope(const AmxScope&) = delete;
  AmxScope& operator=(const AmxScope&) = delete;
};

}  // namespace tessera::ops::cpu
