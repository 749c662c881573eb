#!/usr/bin/env python3
"""megatron-core 0.10.0's own torch_dist checkpoints (dist_checkpointing.save / load of a
GPTModel's sharded_state_dict()), the reference for tessera's reader and writer.

Runs in the tdist venv (torch 2.5.1, numpy<2, megatron-core 0.10.0 --no-deps, packaging): the
torch_dist writer of core_r0.10.0 fails on newer torch. On the CPU with gloo on loopback; what
needs CUDA is stubbed as in megatron_core_models.py (torch.cuda.current_device "cpu",
torch.cuda.synchronize a no-op, the CUDA RNG tracker's fork a null context), plus Tensor.cuda
the identity for the tied output layer of the last pipeline stage.

    python megatron_dist_checkpoint.py save OUT --models gpt llama [--tp 2 --pp 2]
spawns TP x PP processes that build megatron-core's GPTModel (local spec, 4 layers, random
weights: biases and norms too), take one step of Megatron's optimizer (get_megatron_optimizer,
torch's AdamW underneath) on random gradients, and save as Megatron's save_checkpoint does with
--ckpt-format torch_dist (megatron/training/checkpointing.py generate_state_dict): args,
checkpoint_version, iteration, model, optimizer (its sharded_state_dict), opt_param_scheduler,
num_floating_point_operations_so_far into OUT/<model>/iter_0000007, and the tracker "7".

    python megatron_dist_checkpoint.py dump ROOT OUT_DIR --models gpt llama [--tp 1 --pp 1] [--optim]
loads ROOT/<model>'s latest iteration with dist_checkpointing.load into a GPTModel of the given
layout (megatron-core reshards) and writes to OUT_DIR/<model>.safetensors every parameter, whole (gathered over TP, each
stage's layers renumbered globally), under megatron-core's TP=1 names, plus `iteration` and
`optimizer.<exp_avg|exp_avg_sq>.<name>` when --optim (the whole model's Adam moments).
"""
import argparse
import contextlib
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


def init_cpu_megatron(rank, world, tp, pp, port):
    torch.cuda.current_device = lambda: "cpu"
    torch.cuda.synchronize = lambda *a, **k: None
    # The tied output layer's copy on the last stage (LanguageModule.setup_embeddings_and_output_layer)
    # is moved to the GPU before its all-reduce: it stays on the CPU.
    torch.Tensor.cuda = lambda self, *a, **k: self
    # Megatron's optimizer wrappers make their loss-scale tensors with device='cuda'.
    make_tensor = torch.tensor
    torch.tensor = lambda *a, device=None, **k: make_tensor(*a, device=None if device == "cuda" else device, **k)
    import torch.distributed as dist
    from megatron.core import parallel_state
    from megatron.core.tensor_parallel import random as tp_random
    tp_random.CudaRNGStatesTracker.fork = lambda self, name="model-parallel-rng": contextlib.nullcontext()
    os.environ["MASTER_ADDR"] = "127.0.0.1"
    os.environ["MASTER_PORT"] = str(port)
    dist.init_process_group("gloo", rank=rank, world_size=world)
    parallel_state.initialize_model_parallel(tp, pp)


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
    from megatron.core.models.gpt.gpt_layer_specs import get_gpt_layer_local_spec
    config = mcm.config_from_args(args)
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


def save_rank(rank, world, tp, pp, port, out, models, distributed):
    init_cpu_megatron(rank, world, tp, pp, port)
    for model_name in models:
        save_model(rank, world, tp, pp, os.path.join(out, model_name), model_name, distributed)


def save_model(rank, world, tp, pp, out, model_name, distributed):
    from megatron.core import dist_checkpointing
    from megatron.core.optimizer_param_scheduler import OptimizerParamScheduler
    run = GPT if model_name == "gpt" else LLAMA
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
    kwargs = {"sharding_type": "dp_zero_gather_scatter"} if distributed else {}
    state["optimizer"] = optimizer.sharded_state_dict(state, **kwargs)
    state["opt_param_scheduler"] = scheduler.state_dict()
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


def dump_rank(rank, world, tp, pp, port, ckpt_root, out_dir, models, with_optim):
    init_cpu_megatron(rank, world, tp, pp, port)
    for model_name in models:
        dump_model(rank, world, tp, pp, os.path.join(ckpt_root, model_name),
                   os.path.join(out_dir, model_name + ".safetensors"),
                   model_name, with_optim)


def dump_model(rank, world, tp, pp, ckpt, out, model_name, with_optim):
    from megatron.core import dist_checkpointing, parallel_state
    run = GPT if model_name == "gpt" else LLAMA
    args = namespace(run, tp, pp, world)
    args.use_distributed_optimizer = False
    model = build_stage(args)
    iteration = int(open(os.path.join(ckpt, "latest_checkpointed_iteration.txt")).read())
    folder = os.path.join(ckpt, "iter_%07d" % iteration)
    state = {"model": model.sharded_state_dict()}
    optimizer = None
    if with_optim:
        ddp, optimizer = megatron_optimizer(args, model)
        state["optimizer"] = optimizer.sharded_state_dict(state, is_loading=True)
    loaded = dist_checkpointing.load(state, folder)
    common = dist_checkpointing.load_common_state_dict(folder)
    model.load_state_dict(loaded["model"], strict=True)
    if with_optim:
        optimizer.load_state_dict(loaded["optimizer"])
    first = parallel_state.get_pipeline_model_parallel_rank() * (LAYERS // pp)
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
        if optimizer is not None:
            inner = optimizer.optimizer
            st = inner.state[p] if p in inner.state else None
            for kind in ("exp_avg", "exp_avg_sq"):
                tensors.append(("optimizer.%s.%s" % (kind, gname), global_tensor(name, st[kind], tp, args.swiglu)))
    gathered = [None] * world
    torch.distributed.all_gather_object(gathered, [(n, t.float().numpy()) for n, t in tensors])
    if rank == 0:
        merged = dict(kv for part in gathered for kv in part)
        records = [(n, "F32", merged[n]) for n in sorted(merged)]
        records.append(("iteration", "I64", np.array([common["iteration"]], dtype=np.int64)))
        safetensors_io.write(out, records)
        print("dumped %d tensors of iteration %d" % (len(records) - 1, common["iteration"]))


def main():
    p = argparse.ArgumentParser()
    p.add_argument("action", choices=["save", "dump"])
    p.add_argument("paths", nargs="+")
    p.add_argument("--models", nargs="+", choices=["gpt", "llama"], required=True)
    p.add_argument("--tp", type=int, default=2)
    p.add_argument("--pp", type=int, default=2)
    p.add_argument("--distributed-optimizer", action="store_true")
    p.add_argument("--optim", action="store_true", help="dump: also the Adam moments")
    a = p.parse_args()
    world = a.tp * a.pp
    port = 20000 + os.getpid() % 20000
    import torch.multiprocessing as mp
    if a.action == "save":
        mp.spawn(save_rank, args=(world, a.tp, a.pp, port, a.paths[0], a.models, a.distributed_optimizer),
                 nprocs=world)
    else:
        mp.spawn(dump_rank, args=(world, a.tp, a.pp, port, a.paths[0], a.paths[1], a.models, a.optim), nprocs=world)


if __name__ == "__main__":
    main()
