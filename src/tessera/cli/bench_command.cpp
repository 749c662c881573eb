// `tessera bench <what>`: benchmarks that ship with the binary. `comm` is the nccl-tests-style
// collective sweep of comm/comm_bench.h.
#include <cstdio>
#include <string>

#include "tessera/cli/commands.h"
#include "tessera/comm/comm_bench.h"
#include "tessera/core/error.h"

namespace tessera::cli {

int run_bench(int argc, char** argv) {
  const std::string what = argc > 0 ? argv[0] : "";
  if (what == "comm") return run_comm_bench(argc - 1, argv + 1);
  if (what.empty() || what == "--help" || what == "-h") {
    std::printf("usage: tessera bench <benchmark> [flags]\n\nbenchmarks:\n"
                "  comm         collective sweep (nccl-tests style) through tessera's Communicator and raw Gloo\n"
                "\n`tessera bench <benchmark> --help` lists its flags.\n");
    return what.empty() ? 2 : 0;
  }
  throw usage_error("unknown benchmark '" + what + "'", "`tessera bench --help` lists them");
}

}  // namespace tessera::cli
