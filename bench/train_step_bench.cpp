// Times tessera's training step (forward, backward, clipping, AdamW) on the CPU backend and
// prints ms/step, tokens/s and model FLOP/s by llm.c's formula:
//   6 * params * tokens + 6 * layers * hidden * seq * tokens.
// usage: train_step_bench [gpt2-124m|gpt2-124m-t1024|small] [steps] [--deterministic-mode] [--op-profile]
//                         [tessera train flags, e.g. --bf16]
// (--deterministic-mode: the unfused attention of that mode, for a side-by-side figure;
// --op-profile: also each op's calls, CPU and wall ms per timed step, ops/op_profile.h,
// and the step's process CPU ms, the figures to compare on a shared machine).
#include <omp.h>

#include <chrono>
#include <cstdio>
#include <cstring>
#include <ctime>
#include <string>
#include <vector>

#include "tessera/device/device.h"
#include "tessera/model/gpt.h"
#include "tessera/ops/kernel_table.h"
#include "tessera/ops/op_profile.h"
#include "tessera/train/arguments.h"
#include "tessera/train/training_data.h"
#include "tessera/train/trainer.h"

using namespace tessera;

namespace {

double process_cpu_ms() {
  timespec t;
  clock_gettime(CLOCK_PROCESS_CPUTIME_ID, &t);
  return static_cast<double>(t.tv_sec) * 1e3 + static_cast<double>(t.tv_nsec) * 1e-6;
}

void print_op_profile(int steps, double step_cpu_ms) {
  double ops_cpu = 0;
  for (const ops::OpTime& o : ops::op_profile()) ops_cpu += o.cpu_ms;
  std::printf("per step: process CPU %.1f ms, in ops %.1f ms\n", step_cpu_ms, ops_cpu / steps);
  for (const ops::OpTime& o : ops::op_profile())
    std::printf("  %-32s %5.0f calls  CPU %8.1f ms %5.1f%%  wall %8.1f ms\n", ops::op_name(o.op),
                static_cast<double>(o.calls) / steps, o.cpu_ms / steps, 100 * o.cpu_ms / ops_cpu, o.wall_ms / steps);
}

}  // namespace

int main(int argc, char** argv) {
  std::vector<std::string> positional, extra;
  bool deterministic = false, profile = false;
  for (int i = 1; i < argc; ++i) {
    if (std::strcmp(argv[i], "--deterministic-mode") == 0) deterministic = true;
    else if (std::strcmp(argv[i], "--op-profile") == 0) profile = true;
    else if (std::strncmp(argv[i], "--", 2) == 0) extra.push_back(argv[i]);
    else positional.push_back(argv[i]);
  }
  const std::string shape = positional.size() > 0 ? positional[0] : "gpt2-124m";
  const int steps = positional.size() > 1 ? std::atoi(positional[1].c_str()) : 5;
  // GPT-2 124M at micro-batch 4, sequence 64 (llm.c's CPU benchmark), or at micro-batch 1,
  // sequence 1024 (gpt2-124m-t1024); "small" is a 6-layer, 384-wide model at sequence 256.
  // Dropout off in all, as in llm.c and the PyTorch peer.
  const bool t1024 = shape == "gpt2-124m-t1024";
  std::vector<std::string> flags =
      shape == "small"
          ? std::vector<std::string>{"--num-layers", "6", "--hidden-size", "384", "--num-attention-heads", "6",
                                     "--seq-length", "256", "--max-position-embeddings", "256",
                                     "--micro-batch-size", "4", "--tokenizer-type", "NullTokenizer",
                                     "--vocab-size", "8191"}
          : std::vector<std::string>{"--num-layers", "12", "--hidden-size", "768", "--num-attention-heads", "12",
                                     "--seq-length", t1024 ? "1024" : "64", "--max-position-embeddings", "1024",
                                     "--micro-batch-size", t1024 ? "1" : "4", "--tokenizer-type", "NullTokenizer",
                                     "--vocab-size", "50256"};
  flags.insert(flags.end(), {"--mock-data", "--lr", "1e-4", "--train-iters", "1000", "--hidden-dropout", "0",
                             "--attention-dropout", "0", "--eval-iters", "0"});
  flags.insert(flags.end(), extra.begin(), extra.end());
  std::vector<char*> args_argv;
  for (auto& f : flags) args_argv.push_back(f.data());
  TrainArgs args = parse_train_args(static_cast<int>(args_argv.size()), args_argv.data());

  cpu_device().set_deterministic_mode(deterministic);
  GPTModel model(args.model, cpu_device(), static_cast<int>(args.micro_batch_size));
  model.init_weights();
  TrainingData data = build_training_data(args);
  Trainer trainer(args, model, data.sources(), cpu_device());
  trainer.train_step();  // warm-up: first touch of every buffer, oneDNN kernel selection
  trainer.train_step();
  if (profile) ops::set_op_profile(true);
  auto start = std::chrono::steady_clock::now();
  const double cpu_start = process_cpu_ms();
  int64_t tokens = 0;
  for (int i = 0; i < steps; ++i) tokens += trainer.train_step().tokens;
  const double seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
  const double cpu_ms = process_cpu_ms() - cpu_start;
  if (profile) ops::set_op_profile(false);

  const GPTConfig& c = args.model;
  const double params = static_cast<double>(model.num_parameters());
  const double flops = 6.0 * params * tokens + 6.0 * c.num_layers * c.hidden_size * c.seq_length * double(tokens);
  std::string extras;
  for (const std::string& e : extra) extras += " " + e;
  std::printf("tessera %s %-10s%s params %.1fM threads %d: %.1f ms/step, %.0f tokens/s, %.1f GFLOP/s (model)\n",
              deterministic ? "deterministic" : "default", shape.c_str(), extras.c_str(), params / 1e6,
              omp_get_max_threads(), seconds * 1000 / steps, tokens / seconds, flops / seconds / 1e9);
  if (profile) print_op_profile(steps, cpu_ms / steps);
  return 0;
}
