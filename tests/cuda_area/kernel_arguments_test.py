#!/usr/bin/python3
"""Every kernel of CUDA's fatbin takes at most CudaLaunch's kMaxArgs arguments.

CudaLaunch (ops/cuda/cuda_launch.h) holds a launch's arguments in a fixed array and throws
"more than N kernel arguments" at run time, on a GPU only; the shared flash attention kernels
(ROPE_ARGS, DROPOUT_PARAMS and POS_ARGS together) once took 44 against a limit of 32, which
no CPU test could see. This test runs the host C preprocessor over kernels.cu's sources (the
OpenCL prelude standing in for the CUDA one: the argument macros are the same), counts each
`__kernel` function's parameters and compares the largest with kMaxArgs.
usage: kernel_arguments_test.py SOURCE_DIR"""
import os
import re
import subprocess
import sys

SRC = os.path.join(sys.argv[1], "src")
KERNELS_CU = os.path.join(SRC, "tessera/ops/cuda/kernels.cu")
LAUNCH_H = os.path.join(SRC, "tessera/ops/cuda/cuda_launch.h")


def preprocessed_sources():
    text = ""
    for line in open(KERNELS_CU):
        m = re.match(r'#include "(.+)"', line)
        if m:
            path = m.group(1).replace("prelude_cuda.cuh", "prelude_opencl.cl")
            text += '#include "%s"\n' % path
    p = subprocess.run(["cpp", "-P", "-I", SRC, "-x", "c", "-"], input=text, capture_output=True, text=True)
    assert p.returncode == 0, p.stderr[-3000:]
    return p.stdout


def parameter_counts(code):
    counts = {}
    for m in re.finditer(r"__kernel\s+void\s+(\w+)\s*\(", code):
        depth, i, commas = 1, m.end(), 0
        while depth:
            c = code[i]
            depth += c == "("
            depth -= c == ")"
            commas += c == "," and depth == 1
            i += 1
        counts[m.group(1)] = commas + 1
    return counts


def main():
    limit = int(re.search(r"kMaxArgs = (\d+);", open(LAUNCH_H).read()).group(1))
    counts = parameter_counts(preprocessed_sources())
    assert len(counts) > 40, "found only %d kernels: did the sources move?" % len(counts)
    over = {k: n for k, n in counts.items() if n > limit}
    widest = max(counts, key=counts.get)
    assert not over, "kernels with more than kMaxArgs = %d arguments: %s" % (limit, over)
    print("ok  %d kernels, the widest %s with %d arguments (CudaLaunch holds %d)" %
          (len(counts), widest, counts[widest], limit))
    return 0


if __name__ == "__main__":
    sys.exit(main())
