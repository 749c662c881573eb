#!/usr/bin/env python3
"""megatron-core 0.10.0's own torch_dist checkpoints (dist_checkpointing.save / load of a
GPTModel's sharded_state_dict()), the reference for tessera's reader and writer.

Runs in the tdist venv (torch 2.5.1, numpy<2, megatron-core 0.10.0 --no-deps, packaging): the
torch_dist writer of core_r0.10.0 fails on newer torch. On the CPU with gloo on loopback; what
needs CUDA is stubbed as in megatron_core_models.py (torch.cuda.current_device "cpu",
torch.cuda.synchronize a no-op, the CUDA RNG tracker's fork a null context), plus Tensor.cuda
the identity for the tied output layer of the last pipeline stage.

    python megatron_dist_checkpoint.py save OUT --models gpt llama moe [--tp 2 --pp 2]
        [--distributed-optimizer-layout TP PP]
spawns 4 processes that build megatron-core's GPTModel at TP x PP (DP the rest; local spec, 4
layers, random weights: biases and norms too), take one step of Megatron's optimizer
(get_megatron_optimizer, torch's AdamW underneath) on random gradients, and save as Megatron's
save_checkpoint does with --ckpt-format torch_dist (megatron/training/checkpointing.py
generate_state_dict): args, checkpoint_version, iteration, model, optimizer (its
sharded_state_dict), opt_param_scheduler, rng_state (get_rng_state's ShardedObject),
rerun_state_machine, num_floating_point_operations_so_far into OUT/<model>/iter_0000007, and the tracker "7". With
--distributed-optimizer-layout the same processes then save OUT/<model>_distopt at that
layout with Megatron's distributed optimizer, whose state is in
Megatron's default layout for it, fully_sharded_model_space (save_checkpoint picks it under the
default --ckpt-fully-parallel-save); the save also writes OUT/<model>_distopt.safetensors, every
parameter, fp32 main parameter (optimizer.fp32_param.<name>) and Adam moment whole, gathered
from the optimizer that saved them.

    python megatron_dist_checkpoint.py dump JOBS.json
runs every job of the JSON list in the same 4 processes, in order, each
{"ckpt": DIR, "model": "gpt"|"llama"|"moe", "tp": T, "pp": P, "out": FILE, "optim": bool,
 "distributed": bool, "rng": bool}: loads DIR's latest iteration with dist_checkpointing.load
into a GPTModel at TP x PP (DP the rest of 4; megatron-core reshards) and writes to FILE every
parameter, whole (gathered over TP, each stage's layers renumbered globally), under
megatron-core's TP=1 names, plus `iteration` and, with "optim", `optimizer.<exp_avg|exp_avg_sq>.
<name>` (the whole model's Adam moments; with "distributed" Megatron's DistributedOptimizer loads
them from the fully_sharded_model_space layout, and `optimizer.fp32_param.<name>` too). "rng"
loads `rng_state` and `rerun_state_machine` as Megatron's load_checkpoint does at the saved
TP/PP and dumps rank 0's `rng.torch_rng_state` (U8) and `rng.np_rng_state` (I64, the 624 words).

torch's AdamW, megatron-core's optimizer without Apex or Transformer Engine, keeps `step` per
parameter; Apex's and TE's FusedAdam, what Megatron runs on GPUs, keep it per group, and
distrib_optimizer.py's fully_sharded_model_space code flattens every per-parameter state tensor
(a 0-dim `step` fails there: "Data should be 1D for a flattened ShardedTensor", whatever the torch
version). hidden_per_param_step hides it from that code, which gives the layout GPU runs write.
"""
import argparse
import contextlib
import json
import os
import random
import sys

import numpy as np
import torch

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, HERE)
import megatron_core_models as mcm  # noqa: E402
import safetensors_io  # noqa: E402

ITERATION = 7
LAYERS = 4
GPT = dict(mcm.GPT, num_layers=LAYERS, ckpt_format="torch_dist", use_dist_ckpt=True)
LLAMA = dict(mcm.LLAMA, num_layers=LAYERS, ckpt_format="torch_dist", use_dist_ckpt=True)
# megatron_core_models.py's MoE Llama: SequentialMLP experts on layers 0 and 2, shared experts.
MOE = dict(mcm.MOE, num_layers=LAYERS, ckpt_format="torch_dist", use_dist_ckpt=True)
RUNS = dict(gpt=GPT, llama=LLAMA, moe=MOE)


def init_cpu_megatron(rank, world, tp, pp, port):
    torch.cuda.current_device = lambda: "cpu"
    torch.cuda.synchronize = lambda *a, **k: None
    # The tied output layer's copy on the last stage (LanguageModule.setup_embeddings_and_output_layer)
    # is moved to the GPU before its all-reduce: it stays on the CPU.
    torch.Tensor.cuda = lambda self, *a, **k: self
    # Megatron's optimizer wrappers make their loss-scale tensors with device='cuda'.
    make_tensor = torch.tensor
    torch.tensor = lambda *a, device=None, **k: make_tensor(*a, device=None if device == "cuda" else device, **k)
    # The distributed optimizer takes parameters whose type() names a CUDA tensor.
    tensor_type = torch.Tensor.type
    torch.nn.Parameter.type = lambda self, *a, **k: tensor_type(self, *a, **k) if a or k else \
        tensor_type(self).replace("torch.", "torch.cuda.", 1)
    import torch.distributed as dist
    from megatron.core import parallel_state
    from megatron.core.tensor_parallel import random as tp_random
    tp_random.CudaRNGStatesTracker.fork = lambda self, name="model-parallel-rng": contextlib.nullcontext()
    os.environ["MASTER_ADDR"] = "127.0.0.1"
    os.environ["MASTER_PORT"] = str(port)
    dist.init_process_group("gloo", rank=rank, world_size=world)
    parallel_state.initialize_model_parallel(tp, pp)
    hide_per_param_step_from_model_space_layout()


@contextlib.contextmanager
def hidden_per_param_step(optimizer):
    """The inner optimizer's per-parameter `step` set aside (see the module's docstring)."""
    inner = optimizer.optimizer
    steps = {p: st.pop("step") for p, st in inner.state.items() if "step" in st}
    try:
        yield
    finally:
        for p, step in steps.items():
            inner.state[p]["step"] = step


def hide_per_param_step_from_model_space_layout():
    from megatron.core.optimizer.distrib_optimizer import DistributedOptimizer as D
    for name in ("sharded_param_state_fs_model_space", "load_parameter_state_from_fs_model_space"):
        original = getattr(D, name)

        def without_step(self, *a, _original=original, **k):
            with hidden_per_param_step(self):
                return _original(self, *a, **k)
        setattr(D, name, without_step)


def rerun_state_object():
    """save_checkpoint's rerun_state_machine (megatron/core/rerun_state_machine.py state_dict)."""
    from megatron.core.rerun_state_machine import get_rerun_state_machine
    return get_rerun_state_machine().state_dict(data_iterator=None, use_dist_ckpt=True)


def rng_state_object():
    """megatron/training/checkpointing.py get_rng_state(use_dist_ckpt=True), one DP rank's list:
    the CPU has no CUDA generator, a 16-byte zero state stands in for it, and the tracker has no
    states (no model_parallel_cuda_manual_seed)."""
    from megatron.core import parallel_state
    from megatron.core.dist_checkpointing.mapping import ShardedObject
    from megatron.core.tensor_parallel import get_cuda_rng_tracker
    state = {"random_rng_state": random.getstate(), "np_rng_state": np.random.get_state(),
             "torch_rng_state": torch.get_rng_state(), "cuda_rng_state": torch.zeros(16, dtype=torch.uint8),
             "rng_tracker_states": get_cuda_rng_tracker().get_states()}
    pp = (parallel_state.get_pipeline_model_parallel_rank(), parallel_state.get_pipeline_model_parallel_world_size())
    tp = (parallel_state.get_tensor_model_parallel_rank(), parallel_state.get_tensor_model_parallel_world_size())
    return ShardedObject("rng_state", [state], (pp[1], tp[1]), (pp[0], tp[0]),
                         replica_id=parallel_state.get_data_parallel_rank(with_context_parallel=True))


def namespace(run, tp, pp, world):
    a = mcm.saved_namespace(run)
    a.tensor_model_parallel_size, a.pipeline_model_parallel_size = tp, pp
    a.transformer_pipeline_model_parallel_size = pp
    a.world_size, a.data_parallel_size = world, world // (tp * pp)
    return a


def build_stage(args):
    """pretrain_gpt.py model_provider for this rank's pipeline stage."""
    from megatron.core import parallel_state
    from megatron.core.models.gpt import GPTModel
    from megatron.core.models.gpt.gpt_layer_specs import get_gpt_decoder_block_spec, get_gpt_layer_local_spec
    config = mcm.config_from_args(args)
    if args.num_experts:  # as megatron_core_models.build_model
        mcm.local_moe_spec()
        spec = get_gpt_decoder_block_spec(config, use_transformer_engine=False)
    else:
        spec = get_gpt_layer_local_spec(args.num_experts, args.moe_grouped_gemm, args.qk_layernorm,
                                        args.multi_latent_attention)
    return GPTModel(config=config, transformer_layer_spec=spec, vocab_size=args.padded_vocab_size,
                    max_sequence_length=args.max_position_embeddings,
                    pre_process=parallel_state.is_pipeline_first_stage(),
                    post_process=parallel_state.is_pipeline_last_stage(), parallel_output=True,
                    share_embeddings_and_output_weights=not args.untie_embeddings_and_output_weights,
                    position_embedding_type=args.position_embedding_type, rotary_base=args.rotary_base)


def megatron_optimizer(args, model):
    """Megatron's optimizer over the DDP-wrapped model (training.py setup_model_and_optimizer)."""
    from megatron.core.distributed import DistributedDataParallel, DistributedDataParallelConfig
    from megatron.core.optimizer import OptimizerConfig, get_megatron_optimizer
    ddp = DistributedDataParallel(model.config, DistributedDataParallelConfig(
        grad_reduce_in_fp32=True, use_distributed_optimizer=args.use_distributed_optimizer), model)
    config = OptimizerConfig(optimizer="adam", lr=args.lr, min_lr=args.min_lr, weight_decay=args.weight_decay,
                             adam_beta1=args.adam_beta1, adam_beta2=args.adam_beta2, adam_eps=args.adam_eps,
                             use_distributed_optimizer=args.use_distributed_optimizer, clip_grad=0.0)
    return ddp, get_megatron_optimizer(config, [ddp])


def save_rank(rank, world, tp, pp, port, out, models, distopt_layout):
    from megatron.core import parallel_state
    init_cpu_megatron(rank, world, tp, pp, port)
    for model_name in models:
        save_model(rank, world, tp, pp, os.path.join(out, model_name), model_name, False)
    if distopt_layout:
        parallel_state.destroy_model_parallel()
        parallel_state.initialize_model_parallel(*distopt_layout)
        for model_name in models:
            save_model(rank, world, *distopt_layout, os.path.join(out, model_name + "_distopt"), model_name, True)


def save_model(rank, world, tp, pp, out, model_name, distributed):
    from megatron.core import dist_checkpointing
    from megatron.core.optimizer_param_scheduler import OptimizerParamScheduler
    run = RUNS[model_name]
    args = namespace(run, tp, pp, world)
    args.use_distributed_optimizer = distributed
    torch.manual_seed(100 + rank)
    random.seed(7)
    np.random.seed(7)
    model = build_stage(args)
    with torch.no_grad():
        for name, p in model.named_parameters():
            p.copy_(1.0 + 0.1 * torch.randn_like(p) if "layernorm" in name else 0.05 * torch.randn_like(p))
    ddp, optimizer = megatron_optimizer(args, model)
    for p in model.parameters():
        p.main_grad.copy_(1e-3 * torch.randn_like(p))
    optimizer.step()
    scheduler = OptimizerParamScheduler(optimizer, 0.0, args.lr, args.min_lr, 1, args.train_iters, "cosine", 0.1, 0.1,
                                        args.train_iters, "constant")
    scheduler.step(ITERATION * args.global_batch_size)
    # save_checkpoint unwraps the model first (megatron/training/checkpointing.py): no "module." prefix.
    state = {"args": args, "checkpoint_version": 3.0, "iteration": ITERATION, "model": model.sharded_state_dict()}
    # save_checkpoint's sharding type under the default --ckpt-fully-parallel-save.
    kwargs = {"sharding_type": "fully_sharded_model_space"} if distributed else {}
    state["optimizer"] = optimizer.sharded_state_dict(state, **kwargs)
    state["opt_param_scheduler"] = scheduler.state_dict()
    state["rng_state"] = rng_state_object()
    state["rerun_state_machine"] = rerun_state_object()
    state["num_floating_point_operations_so_far"] = 1.5e9
    folder = os.path.join(out, "iter_%07d" % ITERATION)
    if rank == 0:
        os.makedirs(folder, exist_ok=True)
    torch.distributed.barrier()
    dist_checkpointing.save(state, folder)
    torch.distributed.barrier()
    if rank == 0:
        with open(os.path.join(out, "latest_checkpointed_iteration.txt"), "w") as f:
            f.write(str(ITERATION))
    if distributed:
        write_whole_tensors(model, optimizer, args, out + ".safetensors",
                            {"iteration": ("I64", np.array([ITERATION], dtype=np.int64))})


def gather_tp(t, dim):
    from megatron.core import parallel_state
    group = parallel_state.get_tensor_model_parallel_group()
    parts = [torch.empty_like(t) for _ in range(torch.distributed.get_world_size(group))]
    torch.distributed.all_gather(parts, t.contiguous(), group=group)
    return torch.cat(parts, dim)


def split_dim(name, t):
    """megatron/core/tensor_parallel/layers.py: column-parallel weights, their biases and the
    vocabulary-parallel tables split rows; row-parallel weights split columns."""
    if any(k in name for k in ("linear_qkv.weight", "linear_qkv.bias", "linear_fc1.weight", "linear_fc1.bias",
                               "word_embeddings.weight", "output_layer.weight")):
        return 0
    if name.endswith("linear_proj.weight") or name.endswith("linear_fc2.weight"):
        return 1
    return None


def global_tensor(name, t, tp, swiglu):
    """The TP=1 tensor of a rank's slice: SwiGLU's fc1 is [gate_r; up_r] per rank."""
    d = split_dim(name, t)
    if d is None or tp == 1:
        return t
    if swiglu and "linear_fc1" in name:
        gate, up = t.chunk(2, 0)
        return torch.cat([gather_tp(gate, 0), gather_tp(up, 0)], 0)
    return gather_tp(t, d)


def dump_rank(rank, world, port, jobs):
    from megatron.core import parallel_state
    init_cpu_megatron(rank, world, jobs[0]["tp"], jobs[0]["pp"], port)
    for job in jobs:
        if (parallel_state.get_tensor_model_parallel_world_size(),
                parallel_state.get_pipeline_model_parallel_world_size()) != (job["tp"], job["pp"]):
            parallel_state.destroy_model_parallel()
            parallel_state.initialize_model_parallel(job["tp"], job["pp"])
        dump_model(job["ckpt"], job["out"], job["model"], job["tp"], job["pp"], world, job.get("optim", False),
                   job.get("distributed", False), job.get("rng", False))


def distributed_optimizer_state(optimizer):
    """model parameter -> (its range, {fp32_param, exp_avg, exp_avg_sq: this DP rank's piece})
    (distrib_optimizer.py gbuf_ranges, as sharded_param_state_fs_model_space walks them)."""
    out = {}
    for gbuf_range_maps in optimizer.gbuf_ranges:
        for per_bucket in gbuf_range_maps.values():
            for gbuf_range_map in per_bucket:
                for model_param, range_map in gbuf_range_map["param_map"].items():
                    group, order = optimizer.model_param_group_index_map[model_param]
                    main = optimizer.optimizer.param_groups[group]["params"][order]
                    st = optimizer.optimizer.state[main]
                    out[model_param] = (range_map["param"], {"fp32_param": main, "exp_avg": st["exp_avg"],
                                                             "exp_avg_sq": st["exp_avg_sq"]})
    return out


def whole_over_dp(p, owned, kind):
    """A parameter's optimizer tensor of `kind` whole on this TP rank: every DP rank's piece."""
    from megatron.core import parallel_state
    full = torch.zeros(p.numel(), dtype=torch.float32)
    if p in owned:
        r, tensors = owned[p]
        full[r.start:r.end] = tensors[kind].detach().float()
    torch.distributed.all_reduce(full, group=parallel_state.get_data_parallel_group())
    return full.view(p.shape)


def write_whole_tensors(model, optimizer, args, out, extra):
    """Every parameter of the model (and its optimizer state), whole and under TP=1 names,
    into `out` from global rank 0."""
    from megatron.core import parallel_state
    first = parallel_state.get_pipeline_model_parallel_rank() * (LAYERS // args.pipeline_model_parallel_size)
    tp = args.tensor_model_parallel_size
    owned = distributed_optimizer_state(optimizer) if optimizer is not None and args.use_distributed_optimizer \
        else None
    kinds = ("exp_avg", "exp_avg_sq") + (("fp32_param",) if owned is not None else ())
    tensors = []
    for name, p in model.named_parameters():
        if not parallel_state.is_pipeline_first_stage() and name == "output_layer.weight" \
                and not args.untie_embeddings_and_output_weights:
            continue  # the tied copy
        parts = name.split(".")
        if parts[:2] == ["decoder", "layers"]:
            parts[2] = str(int(parts[2]) + first)
        gname = ".".join(parts)
        tensors.append((gname, global_tensor(name, p.detach(), tp, args.swiglu)))
        for kind in kinds if optimizer is not None else ():
            t = whole_over_dp(p, owned, kind) if owned is not None else optimizer.optimizer.state[p][kind]
            tensors.append(("optimizer.%s.%s" % (kind, gname), global_tensor(name, t, tp, args.swiglu)))
    gathered = [None] * torch.distributed.get_world_size()
    torch.distributed.all_gather_object(gathered, [(n, t.float().numpy()) for n, t in tensors])
    if torch.distributed.get_rank() == 0:
        merged = {}
        for part in gathered:  # a TP-replicated tensor as TP rank 0 holds it (the saved replica)
            for name, value in part:
                merged.setdefault(name, value)
        records = [(n, "F32", merged[n]) for n in sorted(merged)]
        records += [(n, dtype, value) for n, (dtype, value) in sorted(extra.items())]
        safetensors_io.write(out, records)
        print("wrote %d tensors to %s" % (len(records), out))


def dump_model(ckpt, out, model_name, tp, pp, world, with_optim, distributed, with_rng):
    from megatron.core import dist_checkpointing
    run = RUNS[model_name]
    args = namespace(run, tp, pp, world)
    args.use_distributed_optimizer = distributed
    model = build_stage(args)
    iteration = int(open(os.path.join(ckpt, "latest_checkpointed_iteration.txt")).read())
    folder = os.path.join(ckpt, "iter_%07d" % iteration)
    state = {"model": model.sharded_state_dict()}
    optimizer = None
    if with_optim:
        ddp, optimizer = megatron_optimizer(args, model)
        if distributed:
            # Without Apex or TE, DistributedOptimizer.state_dict reads the per-parameter step of
            # torch's AdamW, which has no state before its first step: one on zero gradients makes
            # it (the load replaces every value it touches).
            for p in model.parameters():
                p.main_grad.zero_()
            optimizer.step()
        kwargs = {"sharding_type": "fully_sharded_model_space"} if distributed else {}
        state["optimizer"] = optimizer.sharded_state_dict(state, is_loading=True, **kwargs)
    if with_rng:  # what load_checkpoint asks for at the saved TP/PP
        state["rng_state"] = rng_state_object()
        state["rerun_state_machine"] = rerun_state_object()
    loaded = dist_checkpointing.load(state, folder)
    common = dist_checkpointing.load_common_state_dict(folder)
    model.load_state_dict(loaded["model"], strict=True)
    if with_optim:
        optimizer.load_state_dict(loaded["optimizer"])
    extra = {"iteration": ("I64", np.array([common["iteration"]], dtype=np.int64))}
    if with_rng:
        # checkpointing.py load_checkpoint: rng_state[0] without --data-parallel-random-init.
        from megatron.core.rerun_state_machine import get_rerun_state_machine
        get_rerun_state_machine().load_state_dict(loaded["rerun_state_machine"])
        rng = loaded["rng_state"][0]
        extra["rng.torch_rng_state"] = ("U8", rng["torch_rng_state"].numpy())
        extra["rng.np_rng_state"] = ("I64", np.asarray(rng["np_rng_state"][1], dtype=np.int64))
    write_whole_tensors(model, optimizer, args, out, extra)


def main():
    p = argparse.ArgumentParser()
    p.add_argument("action", choices=["save", "dump"])
    p.add_argument("path", help="save: OUT; dump: JOBS.json")
    p.add_argument("--models", nargs="+", choices=sorted(RUNS), default=["gpt", "llama"])
    p.add_argument("--tp", type=int, default=2)
    p.add_argument("--pp", type=int, default=2)
    p.add_argument("--distributed-optimizer-layout", type=int, nargs=2, metavar=("TP", "PP"),
                   help="save: also <model>_distopt at this TP x PP (DP the rest of 4) with Megatron's")
    a = p.parse_args()
    world = 4
    port = 20000 + os.getpid() % 20000
    import torch.multiprocessing as mp
    if a.action == "save":
        mp.spawn(save_rank, args=(world, a.tp, a.pp, port, a.path, a.models, a.distributed_optimizer_layout),
                 nprocs=world)
    else:
        with open(a.path) as f:
            jobs = json.load(f)
        mp.spawn(dump_rank, args=(world, port, jobs), nprocs=world)


if __name__ == "__main__":
    main()
