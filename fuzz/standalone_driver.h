// The command line and seed files of the standalone fuzz drivers (the main() a fuzz target has
// when it is not built with libFuzzer, see tests/ckpt_area/tests.cmake):
//   PROGRAM [--seconds N] [--seed S] [--runs N] [--replay FILE] [FILE...]
// Header-only: each target compiles its own sources with sanitizers and links no library.
#pragma once

#include <chrono>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <fstream>
#include <iterator>
#include <optional>
#include <string>
#include <vector>

namespace fuzz_driver {

struct Args {
  double seconds = 30;  // how long to mutate
  uint64_t seed = static_cast<uint64_t>(std::chrono::steady_clock::now().time_since_epoch().count());
  uint64_t max_runs = UINT64_MAX;
  std::optional<std::string> replay;  // run this one input and stop
  std::vector<std::string> files;     // more seeds
};

// The whole file, or exit 2 naming it: a seed that cannot be read is a usage error.
inline std::vector<uint8_t> read_file(const char* program, const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  if (!in) {
    std::fprintf(stderr, "%s: cannot read %s\n", program, path.c_str());
    std::exit(2);
  }
  return {std::istreambuf_iterator<char>(in), std::istreambuf_iterator<char>()};
}

// Exits 0 after --help, 2 for a flag without its value.
inline Args parse_args(const char* program, int argc, char** argv) {
  Args args;
  for (int i = 1; i < argc; ++i) {
    const std::string a = argv[i];
    auto value = [&]() -> std::string {
      if (i + 1 >= argc) {
        std::fprintf(stderr, "%s: %s needs a value\n", program, a.c_str());
        std::exit(2);
      }
      return argv[++i];
    };
    if (a == "--seconds") args.seconds = std::stod(value());
    else if (a == "--seed") args.seed = std::stoull(value());
    else if (a == "--runs") args.max_runs = std::stoull(value());
    else if (a == "--replay") args.replay = value();
    else if (a == "-h" || a == "--help") {
      std::printf("usage: %s [--seconds N] [--seed S] [--runs N] [--replay FILE] [FILE...]\n", program);
      std::exit(0);
    } else args.files.push_back(a);
  }
  return args;
}

}  // namespace fuzz_driver
