// `tessera train`: Megatron's pretrain_gpt on one process.
#include <sys/resource.h>

#include <cstdio>
#include <cstring>

#include "tessera/ckpt/hf_gpt2.h"
#include "tessera/cli/commands.h"
#include "tessera/core/log.h"
#include "tessera/device/device.h"
#include "tessera/model/gpt.h"
#include "tessera/train/arguments.h"
#include "tessera/train/trainer.h"
#include "tessera/train/training_data.h"

namespace tessera::cli {

int run_train(int argc, char** argv) {
  for (int i = 0; i < argc; ++i) {
    if (!std::strcmp(argv[i], "--help") || !std::strcmp(argv[i], "-h")) {
      train_option_table().print_help();
      return 0;
    }
  }
  ParsedOptions parsed;
  TrainArgs args = parse_train_args(argc, argv, &parsed);
  train_option_table().print_arguments(parsed);

  Device& device = cpu_device();
  const GPTConfig& c = args.model;
  print_rank_0("> distributed backend: gloo (the CPU device's collective library), world size 1");
  print_rank_0(" > padded vocab (size: %d) with %d dummy tokens (new size: %d)", c.vocab_size,
               c.padded_vocab_size - c.vocab_size, c.padded_vocab_size);

  GPTModel model(c, device, static_cast<int>(args.micro_batch_size));
  if (args.init_from_hf.empty()) {
    model.init_weights();
  } else {
    model.load_weights(load_hf_gpt2(args.init_from_hf, c));
    print_rank_0(" > initialised from Hugging Face GPT-2 weights in %s", args.init_from_hf.c_str());
  }
  print_rank_0(" > number of parameters on (tensor, pipeline) model parallel rank (0, 0): %lld",
               static_cast<long long>(model.num_parameters()));

  TrainingData data = build_training_data(args);
  Trainer trainer(args, model, data.sources(), device);
  print_rank_0("[after model, optimizer, and learning rate scheduler are built] memory allocated: %.1f MiB",
               device.allocated_bytes() / 1048576.0);
  print_rank_0("training ...");
  trainer.train();

  struct rusage usage {};
  getrusage(RUSAGE_SELF, &usage);
  print_rank_0("peak resident memory: %.1f MiB (tessera allocations: peak %.1f MiB)", usage.ru_maxrss / 1024.0,
               device.peak_allocated_bytes() / 1048576.0);
  return 0;
}

}  // namespace tessera::cli
