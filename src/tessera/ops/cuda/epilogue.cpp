// CUDA's host side of ops/kernels/epilogue_host.inc: the shared kernels after and before
// cuBLASLt's GEMMs (linear.cpp). cuBLASLt's GELU_AUX_BIAS / DGELU_BGRAD epilogues (tanh
// GeLU only) can take over these passes on this op's interface.
#include "tessera/ops/cuda/cuda_launch.h"
#include "tessera/ops/cuda/cuda_ops.h"

#define TESSERA_BACKEND cuda
#include "tessera/ops/kernels/epilogue_host.inc"
#undef TESSERA_BACKEND
