// The fatbin of kernels.cu, linked into the binary as read-only data (the assembler's
// .incbin reads the file nvcc wrote; TESSERA_CUDA_FATBIN is its path, set by CMake), so a
// running program never looks for kernel files on disk. cuda_launch.cpp loads it.
asm(".section .rodata\n"
    ".balign 64\n"
    ".global tessera_cuda_fatbin\n"
    ".type tessera_cuda_fatbin, @object\n"
    "tessera_cuda_fatbin:\n"
    ".incbin \"" TESSERA_CUDA_FATBIN "\"\n"
    ".previous\n");
