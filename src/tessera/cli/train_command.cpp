// `tessera train`: Megatron's pretrain_gpt. One process, or one of many started by
// `tessera launch`, torchrun or Slurm (launch/worker_env.h says how each is recognised).
#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstring>
#include <optional>
#include <string>
#include <vector>

#include "tessera/ckpt/checkpoint.h"
#include "tessera/ckpt/hf_export.h"
#include "tessera/ckpt/torch_dist.h"
#include "tessera/cli/commands.h"
#include "tessera/comm/backend.h"
#include "tessera/core/file_io.h"
#include "tessera/core/log.h"
#include "tessera/device/registry.h"
#include "tessera/launch/job_store.h"
#include "tessera/launch/worker_env.h"
#include "tessera/model/gpt.h"
#include "tessera/ops/kernel_table.h"
#include "tessera/parallel/topology.h"
#include "tessera/train/arguments.h"
#include "tessera/train/exit_signal.h"
#include "tessera/train/megatron_args.h"
#include "tessera/train/memory_plan.h"
#include "tessera/train/run_device.h"
#include "tessera/train/trainer.h"
#include "tessera/train/training_data.h"

namespace tessera::cli {

namespace {

// The metadata of --load's latest checkpoint, when there is one to resume.
std::optional<CheckpointState> checkpoint_to_resume(const TrainArgs& args) {
  if (args.load.empty()) return std::nullopt;
  const std::optional<int64_t> latest = latest_checkpoint_iteration(args.load);
  if (!latest) return std::nullopt;
  return read_checkpoint_metadata(args.load, *latest);
}

// The format of --load's latest checkpoint, as --ckpt-format names it.
std::string checkpoint_format_name(const std::string& dir) {
  const int64_t latest = *latest_checkpoint_iteration(dir);
  if (is_torch_dist_checkpoint(dir, latest)) return "torch_dist";
  return read_checkpoint_metadata(dir, latest).megatron_format ? "torch" : "tessera";
}

// --use-checkpoint-args: the command line with the model flags of --load's checkpoint, which
// replace the values given for the same flags, as Megatron's load_args_from_checkpoint
// (megatron/training/checkpointing.py) overrides the command line with the checkpoint's
// Namespace. Megatron-LM's formats only (tessera's records its command line, not a Namespace).
// The value of `flag` on a command line ("--load DIR" or "--load=DIR"), before it is parsed.
std::optional<std::string> flag_value(const std::vector<std::string>& argv, const std::string& flag) {
  for (size_t i = 0; i < argv.size(); ++i) {
    if (argv[i] == flag && i + 1 < argv.size()) return argv[i + 1];
    if (argv[i].rfind(flag + "=", 0) == 0) return argv[i].substr(flag.size() + 1);
  }
  return std::nullopt;
}

std::vector<std::string> with_checkpoint_args(std::vector<std::string> argv) {
  if (std::find(argv.begin(), argv.end(), "--use-checkpoint-args") == argv.end()) return argv;
  const std::optional<std::string> load = flag_value(argv, "--load");
  if (!load) throw usage_error("--use-checkpoint-args takes the model flags from --load's checkpoint", "pass --load DIR");
  const std::optional<int64_t> latest = latest_checkpoint_iteration(*load);
  if (!latest) throw usage_error("--use-checkpoint-args: --load " + *load + " holds no checkpoint");
  const CheckpointState s = read_checkpoint_metadata(*load, *latest);
  if (!s.megatron_format)
    throw usage_error("--use-checkpoint-args reads the Namespace of Megatron-LM's checkpoints; " + *load +
                          " is in tessera's format, which records its command line instead",
                      "pass the model flags `tessera ckpt inspect " + *load + "` prints");
  const std::vector<std::string> flags = train_flags_from_megatron_args(s.args);
  for (size_t i = 0; i < flags.size(); ++i) {
    const bool valued = i + 1 < flags.size() && flags[i + 1].rfind("--", 0) != 0;
    auto given = std::find(argv.begin(), argv.end(), flags[i]);
    if (given == argv.end()) {
      argv.push_back(flags[i]);
      if (valued) argv.push_back(flags[i + 1]);
    } else if (valued && given + 1 != argv.end()) {
      *(given + 1) = flags[i + 1];
    }
    if (valued) ++i;
  }
  return argv;
}

// --train-iters (or --train-samples) as the user gave it.
std::string train_length_flag(const TrainArgs& args) {
  if (args.train_samples)
    return "--train-samples " + std::to_string(*args.train_samples) + " (" + std::to_string(args.train_iters) +
           " iterations)";
  return "--train-iters " + std::to_string(args.train_iters);
}

// A checkpoint past the flags' last iteration leaves nothing to train. Megatron's loop would
// run no iteration (its schedule check stops it first unless --override-opt_param-scheduler),
// then evaluate and exit 0: a run that silently did nothing. tessera refuses before any
// allocation, naming both numbers.
void check_checkpoint_not_past_train_iters(const TrainArgs& args, const CheckpointState& saved) {
  if (args.finetune || saved.release || saved.iteration <= args.train_iters) return;
  throw usage_error("the checkpoint in --load " + args.load + " is at iteration " + std::to_string(saved.iteration) +
                        ", already past " + train_length_flag(args) + ": there is nothing to train",
                    "raise --train-iters above " + std::to_string(saved.iteration) +
                        " to train on (add --override-opt_param-scheduler to take the new length's learning-rate "
                        "schedule), or add --finetune to start a new run from its weights");
}

// Megatron takes the padded vocabulary from the checkpoint's arguments: a checkpoint saved at
// another TP (and so another padding) resumes with its own size, which the new TP must divide.
void keep_checkpoint_padded_vocab(TrainArgs& args, const CheckpointState& checkpoint) {
  const int64_t saved = checkpoint.layout.padded_vocab_size;
  GPTConfig& m = args.model;
  if (saved == 0 || saved == m.padded_vocab_size) return;  // 0: format 1 records none
  if (saved < m.vocab_size || saved % args.tensor_parallel_size != 0)
    throw usage_error("the checkpoint in " + args.load + " has a padded vocabulary of " + std::to_string(saved) +
                          ", which --tensor-model-parallel-size " + std::to_string(args.tensor_parallel_size) +
                          " does not divide (or which is smaller than the tokenizer's " +
                          std::to_string(m.vocab_size) + ")",
                      "resume with a tensor-parallel size that divides " + std::to_string(saved));
  print_rank_0(" > keeping the checkpoint's padded vocabulary %lld (the flags alone give %d)",
               static_cast<long long>(saved), m.padded_vocab_size);
  m.padded_vocab_size = static_cast<int>(saved);
}

// Whether this rank writes files into --save: rank 0 (the folder, the metadata), data-parallel
// rank 0 of every (tp, pp) (the model), and with tessera's distributed-optimizer files every
// rank (its own shard of the optimizer state).
bool writes_checkpoints(const TrainArgs& args, const Topology& topology) {
  if (args.save.empty()) return false;
  const bool every_rank =
      args.use_distributed_optimizer && !args.no_save_optim && !args.save_megatron_format && !args.save_torch_dist;
  return topology.rank() == 0 || topology.dp_rank() == 0 || every_rank;
}

// The device with this run's precision and determinism settings, checked for every op the
// run will call before any rank connects or allocates.
Device& open_training_device(const TrainArgs& args) {
  Device& device = open_device(args.device);
  device.set_tf32_matmul(args.tf32);
  device.set_deterministic_mode(args.deterministic_mode);
  if (args.tf32 && !device.tf32_matmul())
    log_warn("--tf32 has no effect on %s: its f32 GEMMs stay exact", device.name().c_str());
  ops::check_supported(device, training_ops(args, device));
  return device;
}

// The job's store, the world communicator and the parallel groups; all empty in one process.
// Members are destroyed in reverse order: the groups and the world before the store they use.
struct ConnectedWorld {
  launch::JobStore job_store;
  std::unique_ptr<Communicator> world;
  ParallelGroups groups;
};

ConnectedWorld connect_world(const launch::WorkerIdentity& id, const TrainArgs& args, const Topology& topology,
                             const CommBackendChoice& backend) {
  ConnectedWorld w;
  if (!id.distributed()) return w;
  print_rank_0("> initializing torch distributed ... %s", id.describe().c_str());
  const std::chrono::milliseconds timeout = std::chrono::minutes(args.distributed_timeout_minutes);
  w.job_store = launch::open_job_store(id, timeout);
  CommOptions options;
  options.backend = backend.backend;
  options.timeout = timeout;
  options.master_addr = id.master_addr;
  options.master_port = id.master_port;
  options.key_prefix = id.key_prefix;
  w.world = create_communicator(std::shared_ptr<Store>(std::move(w.job_store.store)), id.rank, id.world_size, options);
  w.groups = create_parallel_groups(*w.world, topology);
  return w;
}

ModelPartition model_partition(const TrainArgs& args, const Topology& topology) {
  ModelPartition partition;
  partition.tp_size = args.tensor_parallel_size;
  partition.tp_rank = topology.tp_rank();
  partition.sequence_parallel = args.sequence_parallel;
  partition.cp_size = args.context_parallel_size;
  partition.cp_rank = topology.cp_rank();
  partition.ep_size = topology.ep_size();
  partition.ep_rank = topology.ep_rank();
  partition.chunks = pipeline_chunks(args.model.num_layers, args.pipeline_split, topology.pp_rank());
  return partition;
}

void init_model_weights(GPTModel& model, const TrainArgs& args) {
  if (args.init_from_hf.empty()) {
    model.init_weights();  // the same weights on every rank: drawn from (seed, parameter, element)
    return;
  }
  model.load_weights(load_hf_model(args.init_from_hf, args.model));
  print_rank_0(" > initialised from Hugging Face %s weights in %s",
               hf_family_name(HFConfigFile::read(args.init_from_hf).family()), args.init_from_hf.c_str());
}

}  // namespace

int run_train(int argc, char** argv) {
  for (int i = 0; i < argc; ++i) {
    if (!std::strcmp(argv[i], "--help") || !std::strcmp(argv[i], "-h")) {
      train_option_table().print_help();
      return 0;
    }
  }
  const launch::WorkerIdentity id = launch::from_environment(argc, argv);
  set_log_rank(id.rank, id.world_size);
  ParsedOptions parsed;
  std::vector<std::string> line = with_checkpoint_args({argv, argv + argc});
  std::vector<char*> line_argv;
  for (std::string& a : line) line_argv.push_back(a.data());
  // before any allocation
  TrainArgs args = parse_train_args(static_cast<int>(line_argv.size()), line_argv.data(), &parsed, id.world_size);
  if (args.exit_signal_handler) install_exit_signal_handler();  // before any thread starts
  if (id.rank == 0) train_option_table().print_arguments(parsed);
  const std::optional<CheckpointState> resumed = checkpoint_to_resume(args);
  const bool converting = !args.ckpt_convert_format.empty();
  // Megatron's converter run exits when --load holds no checkpoint (exit_on_missing_checkpoint).
  if (converting && !resumed)
    throw usage_error("--ckpt-convert-format converts --load's checkpoint, and --load " + args.load + " holds none",
                      "pass the folder with latest_checkpointed_iteration.txt");
  if (resumed && !converting) check_checkpoint_not_past_train_iters(args, *resumed);

  Device& device = open_training_device(args);
  const CommBackendChoice backend = choose_comm_backend(args.distributed_backend, device.backend());
  Topology topology(id.world_size, id.rank, args.tensor_parallel_size, args.pipeline_parallel_size,
                    args.context_parallel_size, args.model.moe.expert_parallel_size);
  const ConnectedWorld connected = connect_world(id, args, topology, backend);
  const ParallelGroups& groups = connected.groups;
  print_rank_0("> %s", topology.describe().c_str());
  print_rank_0("> %s", run_device_line(device).c_str());
  print_rank_0("> %s, world size %d", backend.log_line.c_str(), id.world_size);

  if (writes_checkpoints(args, topology)) check_folder_writable(args.save, "--save");  // not at the first save
  if (resumed) keep_checkpoint_padded_vocab(args, *resumed);
  const GPTConfig& c = args.model;
  const ModelPartition partition = model_partition(args, topology);
  const auto [act_slots, io_slots] = Trainer::pipeline_slots(args, topology.pp_rank());
  print_theoretical_memory(args, device);
  if (args.dry_run) {
    check_data_files(args);
    if (id.local_rank == 0)  // one report per node
      check_node_memory(args, id.rank, std::max(id.local_world_size, 1), device);
    print_rank_0("--dry-run: flags and layout are valid, and the data files are there; not training");
    return 0;
  }
  print_rank_0(" > padded vocab (size: %d) with %d dummy tokens (new size: %d)", c.vocab_size,
               c.padded_vocab_size - c.vocab_size, c.padded_vocab_size);
  const GradBufferLayout buffer_layout = grad_buffer_layout(args, partition, topology.pp_rank());
  GPTModel model(c, device, static_cast<int>(args.micro_batch_size), partition, act_slots, io_slots, groups.tp.get(),
                 &buffer_layout, groups.cp.get(), groups.ep.get());
  init_model_weights(model, args);
  // Megatron prints this from every rank with data-parallel rank 0.
  if (topology.dp_rank() == 0)
    log_info(" > number of parameters on (tensor, pipeline) model parallel rank (%d, %d): %lld", topology.tp_rank(),
            topology.pp_rank(), static_cast<long long>(model.num_parameters()));

  TrainingData data = build_training_data(args, resume_position(args));
  if (connected.world) check_datasets_agree(data, *connected.world);
  TrainerGroups trainer_groups{connected.world.get(),           groups.dp_cp.get(), groups.tp.get(), groups.pp.get(),
                               groups.model_parallel.get(), groups.embedding.get(), groups.cp.get(),
                               groups.ep.get(),        groups.expert_dp.get()};
  Trainer trainer(args, model, data.sources(), device, trainer_groups);
  if (!args.load.empty()) trainer.load_checkpoint(args.load);
  if (converting) {
    trainer.save_checkpoint(args.save);
    print_rank_0("> converted checkpoint: %s -> %s.", checkpoint_format_name(args.load).c_str(),
                 args.ckpt_convert_format.c_str());
    return 0;
  }
  print_rank_0("[after model, optimizer, and learning rate scheduler are built] memory allocated: %.1f MiB",
               device.allocated_bytes() / 1048576.0);
  if (trainer.iteration() < args.train_iters)
    print_rank_0("training ...");
  else  // Megatron would say "training ..." and run no iteration
    print_rank_0("not training: the checkpoint in --load %s is at iteration %lld, which %s already reaches",
                 args.load.c_str(), static_cast<long long>(trainer.iteration()), train_length_flag(args).c_str());
  trainer.train();

  // Every rank's own peaks over the run (Megatron's line, one per rank): with TP/PP they differ.
  log_info("%s", memory_report_line(id.rank, trainer.iteration(), device).c_str());
  return 0;
}

}  // namespace tessera::cli
