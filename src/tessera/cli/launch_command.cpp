// `tessera launch [flags] PROGRAM [ARGS...]`: torchrun's interface; see
// src/tessera/launch/launcher.h and docs/distributed.md.
#include <unistd.h>

#include <climits>
#include <cstdio>
#include <string>
#include <vector>

#include "tessera/cli/commands.h"
#include "tessera/core/error.h"
#include "tessera/launch/launch_options.h"
#include "tessera/launch/launcher.h"

namespace tessera::cli {
namespace {

// The subcommands a bare PROGRAM name may be. `launch` itself is left out: a launcher inside
// a launcher would fight over MASTER_PORT.
const std::vector<std::string> kTesseraSubcommands = {"train", "preprocess", "data", "doctor", "bench", "ckpt"};

std::string self_executable() {
  char buf[PATH_MAX + 1] = {};
  ssize_t n = ::readlink("/proc/self/exe", buf, PATH_MAX);
  if (n <= 0) throw runtime_error("cannot find this program's path (/proc/self/exe)", "is /proc mounted?");
  std::string path(buf, static_cast<size_t>(n));
  // A binary rebuilt while it runs reads "<path> (deleted)"; the new file at <path> is meant.
  const std::string deleted = " (deleted)";
  if (path.size() > deleted.size() && path.compare(path.size() - deleted.size(), deleted.size(), deleted) == 0)
    path.resize(path.size() - deleted.size());
  return path;
}

}  // namespace

int run_launch(int argc, char** argv) {
  launch::LaunchOptions options = launch::parse_launch_options(argc, argv);
  if (options.help) {
    launch::print_launch_help();
    return 0;
  }
  launch::Program program = launch::resolve_program(options, self_executable(), kTesseraSubcommands);
  return launch::run_launcher(options, program);
}

}  // namespace tessera::cli
