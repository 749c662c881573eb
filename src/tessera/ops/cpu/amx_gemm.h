// Two of the linear layer's bf16 GEMMs on AMX tiles, the forward (linear.cpp: long K only) and
// the weight gradient, for linear.cpp's default mode (not --deterministic-mode, which keeps
// oneDNN's order). Legend as in linear.cpp: N rows (tokens), C input channels, OC output
// channels, W[OC, C] as stored; operands bf16 bits, results f32.
// Products of bf16 values are exact in f32 and summed in f32 (TDPBF16PS), like oneDNN's: the
// results differ only in summation order (Linear is OrderFree in ops.inc).
#pragma once

#include <cstdint>

namespace tessera::ops::cpu {

// Whether the amx_linear_* kernels cover this linear here: AMX granted to the process and N,
// C, OC multiples of 32 (the kernels have no tails; other shapes stay with oneDNN).
bool amx_linear_fits(int64_t N, int64_t C, int64_t OC);

// y[N, OC] (+)= x[N, C] @ W[OC, C]^T; y f32 with leading dimension ldy, x and W contiguous.
void amx_linear_forward(float* y, int64_t ldy, const uint16_t* x, const uint16_t* w, int64_t N, int64_t C,
                        int64_t OC, bool accumulate);
// dW[OC, C] (+)= dy[N, OC]^T @ x[N, C]; dy with leading dimension lddy (even), dW and x contiguous.
// With squares, also *squares += the sum of squares of dW as stored, in double, each 32 x 32
// block read back while it is still in L1 (ops.h GradSquares); the order depends on the
// thread count only.
void amx_linear_dweight(float* dw, const uint16_t* dy, int64_t lddy, const uint16_t* x, int64_t N, int64_t C,
                        int64_t OC, bool accumulate, double* squares = nullptr);

}  // namespace tessera::ops::cpu
