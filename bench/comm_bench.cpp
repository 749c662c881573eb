// Collective benchmark, nccl-tests style: the same program as `tessera bench comm` (see
// src/tessera/comm/comm_bench.h for flags and columns). Run it as several ranks:
//   build/bench/comm_bench --spawn 2 -b 1K -e 256M -f 4
#include <cstdio>

#include "tessera/comm/comm_bench.h"
#include "tessera/core/error.h"

int main(int argc, char** argv) {
  try {
    return tessera::run_comm_bench(argc - 1, argv + 1);
  } catch (const tessera::Error& e) {
    std::fprintf(stderr, "error: %s\n", e.what());
    if (!e.hint().empty()) std::fprintf(stderr, "hint: %s\n", e.hint().c_str());
    return e.exit_code();
  }
}
