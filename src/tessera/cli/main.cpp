// tessera: one binary, several subcommands. Invoked as `pretrain_gpt` or `preprocess_data`
// (symlinks) it behaves as `tessera train` / `tessera preprocess`.
#include <cstdio>
#include <cstring>
#include <string>
#include <string_view>
#include <vector>

#include "tessera/cli/commands.h"
#include "tessera/core/error.h"

namespace {

struct Subcommand {
  const char* name;
  int (*run)(int argc, char** argv);
  const char* summary;
};

const Subcommand kSubcommands[] = {
    {"train", tessera::cli::run_train, "GPT pre-training with Megatron-LM's flags"},
    {"preprocess", tessera::cli::run_preprocess, "JSONL/JSON to Megatron's indexed .bin/.idx"},
    {"data", tessera::cli::run_data, "indexed datasets: merge, inspect"},
    {"launch", tessera::cli::run_launch, "start workers on this node as torchrun does (RANK, WORLD_SIZE, ...)"},
    {"doctor", tessera::cli::run_doctor, "pre-flight checks of a training job on every rank (train's flags)"},
    {"ckpt", tessera::cli::run_ckpt,
     "checkpoints: inspect, export-hf, import-hf (Hugging Face GPT-2, Llama, Qwen2), convert (tessera <-> "
     "Megatron-LM torch)"},
    {"bench", tessera::cli::run_bench, "benchmarks: comm (collectives, nccl-tests style)"},
    {"flags", tessera::cli::run_flags, "status in tessera of every Megatron-LM training flag (docs/megatron-flags.md)"},
};

void print_usage() {
  std::printf("usage: tessera <subcommand> [flags]\n\nsubcommands:\n");
  for (const auto& s : kSubcommands) std::printf("  %-12s %s\n", s.name, s.summary);
  std::printf("\n`tessera <subcommand> --help` lists a subcommand's flags.\n");
}

}  // namespace

int main(int argc, char** argv) {
  std::string_view self = argv[0];
  if (auto slash = self.rfind('/'); slash != std::string_view::npos) self = self.substr(slash + 1);
  const char* implied = self == "pretrain_gpt" ? "train" : self == "preprocess_data" ? "preprocess" : nullptr;

  int first = implied ? 1 : 2;
  std::string_view name = implied ? implied : (argc > 1 ? argv[1] : "");
  if (name.empty() || name == "--help" || name == "-h") {
    print_usage();
    return name.empty() ? 2 : 0;
  }
  if (name == "--version") {
    std::printf("tessera %s\n", TESSERA_VERSION);
    return 0;
  }
  for (const auto& s : kSubcommands) {
    if (name != s.name) continue;
    try {
      return s.run(argc - first, argv + first);
    } catch (const tessera::Error& e) {
      std::fprintf(stderr, "error: %s\n", e.what());
      if (!e.hint().empty()) std::fprintf(stderr, "hint: %s\n", e.hint().c_str());
      return e.exit_code();
    }
  }
  std::fprintf(stderr, "error: unknown subcommand '%.*s'\n", static_cast<int>(name.size()), name.data());
  print_usage();
  return 2;
}
