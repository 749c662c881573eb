#!/usr/bin/env python3
"""megatron-core 0.10.0's grouped-GEMM experts (--moe-grouped-gemm) in --ckpt-format torch files,
the reference for src/tessera/ckpt/megatron_grouped_experts.h. Runs in the tools venv on the CPU
as megatron_core_models.py does (its MoE Llama: 4 SwiGLU experts, MoE every second layer, shared
experts), with one more stub, in this test only: GroupedMLP's import-time check for the
grouped_gemm package (not installed; it needs CUDA) passes, and its kernel grouped_gemm.ops.gmm
is the loop its contract states (rows of expert i times b[i]), so that GroupedMLP builds, loads
and runs its own forward. Transformer Engine is not installed either: TEGroupedMLP's files are
SequentialMLP's rank state dicts under TE GroupedLinear's parameter names (weight<i> per expert,
one _extra_state per linear: transformer_engine/pytorch/module/grouped_linear.py) and its
spec's norm names (linear_qkv.layer_norm_weight; linear_fc1.layer_norm_weight in dense layers).

    python megatron_grouped_experts.py save OUT --layouts local te [--tp T] [--ep E]
writes OUT/sequential, megatron_core_models.py's SequentialMLP checkpoint (TP=1, EP=1, AdamW
after one step, expected.safetensors with its logits), and OUT/grouped_local (GroupedMLP) and
OUT/grouped_te (TEGroupedMLP's names), the same weights as the files of a --moe-grouped-gemm run
at TP x EP. Each rank's model is built as that rank builds it
(parallel_state's sizes and ranks set through its setters) and filled the way dist_checkpointing
reshards: the rank model's own sharded_state_dict() (GroupedMLP's ShardedTensorFactory maps its
weight1/weight2 onto SequentialMLP's linear_fc1/linear_fc2 keys) is filled from the TP=1
SequentialMLP model's global tensors and merged back with the factories' merge_fn. At TP=1 EP=1
the local layout also carries the optimizer (torch's AdamW state of SequentialMLP's moments
mapped the same way onto weight1/weight2, Megatron's parameter groups), and GroupedMLP's own
forward of the file must give SequentialMLP's logits (exit 1 otherwise).

    python megatron_grouped_experts.py check DIR EXPECTED
megatron_core_models.py's check of tessera's save DIR (one rank), its Namespace saying
moe_grouped_gemm: GroupedMLP built from it, load_state_dict strict, forward against EXPECTED.

    python megatron_grouped_experts.py check-ep DIR_EP DIR
tessera's save DIR_EP at expert parallelism N loads strictly into each rank's GroupedMLP model,
and each layer's weight1/weight2 storage is rank r's share of DIR's (EP=1): experts r*E/N ..
    python megatron_grouped_experts.py dist-save OUT          (the tdist venv: torch_dist)
megatron_dist_checkpoint.py's MoE Llama (4 layers, one process) saved with --ckpt-format
torch_dist as OUT/sequential (SequentialMLP, Megatron's optimizer after one step), loaded by
dist_checkpointing.load into the --moe-grouped-gemm model (GroupedMLP, its optimizer too), which
gives the same logits and is saved as OUT/grouped; the two .metadata hold the same keys, shapes
and dtypes (megatron-core's GroupedMLP keys its weights, and their optimizer state, as
SequentialMLP's linear_fc1/linear_fc2), or it exits 1 naming the difference.

    python megatron_grouped_experts.py dist-check DIR EXPECTED (the tdist venv)
tessera's torch_dist save DIR of a --moe-grouped-gemm run loads with dist_checkpointing.load into
the GroupedMLP model built from its common.pt args (load_state_dict strict), whose forward of
EXPECTED's tokens gives EXPECTED's logits within 1e-5 of the largest.
"""
import argparse
import copy
import os
import sys

import torch

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, HERE)
import megatron_core_models as mcm  # noqa: E402


def stub_grouped_gemm():
    from megatron.core.transformer.moe import grouped_gemm_util as gg

    class Ops:
        @staticmethod
        def gmm(a, b, batch_sizes, trans_b=False):
            out, start = [], 0
            for i, n in enumerate(batch_sizes.tolist()):
                out.append(a[start:start + n] @ (b[i].t() if trans_b else b[i]))
                start += n
            return torch.cat(out)

    gg.assert_grouped_gemm_is_available = lambda: None
    gg.ops = Ops


def set_ranks(tp, tp_rank, ep, ep_rank):
    from megatron.core import parallel_state as ps
    ps.set_tensor_model_parallel_world_size(tp)
    ps.set_tensor_model_parallel_rank(tp_rank)
    ps.set_expert_tensor_parallel_world_size(tp)
    ps.set_expert_tensor_parallel_rank(tp_rank)
    ps.set_expert_model_parallel_world_size(ep)
    ps.set_expert_model_parallel_rank(ep_rank)


def sharded(model):
    """The model's sharded_state_dict with its factories built, and the factories."""
    from megatron.core.dist_checkpointing.dict_utils import extract_matching_values
    from megatron.core.dist_checkpointing.mapping import ShardedTensorFactory, apply_factories
    sd = model.sharded_state_dict()
    factories, _ = extract_matching_values(sd, lambda x: isinstance(x, ShardedTensorFactory))
    apply_factories(sd)
    return sd, factories


def region(t):
    """Where a ShardedTensor's data lies in its global tensor (its prepended axes of size 1)."""
    shape = (1,) * t.prepend_axis_num + tuple(t.local_shape)
    return tuple(slice(o, o + s) for o, s in zip(t.global_offset, shape))


def global_tensors(model):
    """Every ShardedTensor key's global tensor, from a model at TP=1 EP=1."""
    from megatron.core.dist_checkpointing.dict_utils import dict_list_map_inplace
    from megatron.core.dist_checkpointing.mapping import ShardedTensor
    sd, _ = sharded(model)
    out = {}

    def add(x):
        if isinstance(x, ShardedTensor):
            g = out.setdefault(x.key, torch.zeros(x.global_shape, dtype=x.data.dtype))
            g[region(x)] = x.data.reshape(g[region(x)].shape)
        return x

    dict_list_map_inplace(add, sd)
    return out


def fill_from_global(model, full):
    """Loads the model's shards of `full` as dist_checkpointing.load would."""
    from megatron.core.dist_checkpointing.dict_utils import dict_list_map_inplace
    from megatron.core.dist_checkpointing.mapping import ShardedTensor, apply_factory_merges
    sd, factories = sharded(model)

    def fill(x):
        return full[x.key][region(x)].reshape(x.data.shape).clone() if isinstance(x, ShardedTensor) else x

    dict_list_map_inplace(fill, sd)
    sd = apply_factory_merges(sd, factories)
    tensors = {k: v for k, v in sd.items() if isinstance(v, torch.Tensor)}
    missing, _ = model.load_state_dict(tensors, strict=False)
    missing = [k for k in missing if "_extra_state" not in k]
    assert not missing, missing


def build(args, tp_rank=0, ep_rank=0, tp=None):
    """megatron_core_models.build_model as rank (tp_rank, ep_rank) of TP tp (the Namespace's
    unless given) and the Namespace's EP: its layers size themselves from parallel_state."""
    set_ranks(tp or args.tensor_model_parallel_size, tp_rank, args.expert_model_parallel_size, ep_rank)
    return mcm.build_model(args, ep_rank=ep_rank)


def grouped_namespace(args, tp, ep, layout):
    a = copy.deepcopy(args)
    a.moe_grouped_gemm = True
    a.transformer_impl = "local" if layout == "local" else "transformer_engine"
    a.tensor_model_parallel_size, a.expert_model_parallel_size = tp, ep
    a.data_parallel_size, a.world_size = ep, tp * ep
    a.sequence_parallel = tp > 1  # Megatron's MoE with TP needs it
    return a


def te_state_dict(sd, layer_is_moe):
    """A SequentialMLP rank state dict under the TE spec's names (TEGroupedMLP's experts)."""
    experts = {}  # layer prefix -> linear -> [(expert, kind, tensor)]
    for k, v in sd.items():
        head, sep, tail = k.partition(".mlp.experts.local_experts.")
        if sep and not k.endswith("_extra_state"):
            j, linear, kind = tail.split(".")
            experts.setdefault(head, {}).setdefault(linear, []).append((int(j), kind, v))
    out = {}
    for k, v in sd.items():
        head, sep, _ = k.partition(".mlp.experts.local_experts.")
        if sep:
            if head in experts:  # the layer's first expert entry: all of TEGroupedMLP's
                for linear in ("linear_fc1", "linear_fc2"):
                    for j, kind, t in sorted(experts[head][linear], key=lambda x: x[0]):
                        out["%s.mlp.experts.%s.%s%d" % (head, linear, kind, j)] = t
                    out["%s.mlp.experts.%s._extra_state" % (head, linear)] = None
                del experts[head]
            continue
        if k.endswith(".input_layernorm.weight"):
            k = k.replace(".input_layernorm.weight", ".self_attention.linear_qkv.layer_norm_weight")
        elif k.endswith(".pre_mlp_layernorm.weight") and not layer_is_moe(k):
            k = k.replace(".pre_mlp_layernorm.weight", ".mlp.linear_fc1.layer_norm_weight")
        out[k] = v
    return out


def group_names(model):
    """megatron_core_models.megatron_param_groups's two groups, as parameter names."""
    decay, no_decay = [], []
    for name, p in model.named_parameters():
        (no_decay if name.endswith(".bias") or p.dim() == 1 else decay).append(name)
    return [decay, no_decay]


def optimizer_state(seq_file, seq_model, grouped_args):
    """The saved AdamW state of the SequentialMLP model, as torch's state of the grouped model."""
    names = [n for g in group_names(seq_model) for n in g]
    saved = seq_file["optimizer"]
    kinds = {}
    for i, st in saved["state"].items():
        for kind, t in st.items():
            kinds.setdefault(kind, {})[names[i]] = t
    grouped = {}
    for kind, values in kinds.items():
        if kind == "step":
            continue
        scratch = copy.deepcopy(seq_model)
        scratch.load_state_dict(values, strict=False)
        model = build(grouped_args)
        fill_from_global(model, global_tensors(scratch))
        grouped[kind] = dict(model.named_parameters())
    model = build(grouped_args)
    step = next(iter(saved["state"].values()))["step"]
    state, index, param_groups = {}, 0, []
    for names_of_group, saved_group in zip(group_names(model), saved["param_groups"]):
        indices = []
        for n in names_of_group:
            state[index] = dict(step=step.clone(), **{k: grouped[k][n].detach().clone() for k in grouped})
            indices.append(index)
            index += 1
        param_groups.append(dict(saved_group, params=indices))
    optimizer = torch.optim.AdamW(mcm.megatron_param_groups(model), lr=grouped_args.lr)
    optimizer.load_state_dict({"state": state, "param_groups": param_groups})
    return optimizer.state_dict()


def save_grouped(out, layout, seq_file, seq_model, full, tp, ep):
    """The files of the --moe-grouped-gemm run at TP x EP holding seq_model's weights."""
    args = seq_file["args"]
    rank_args = grouped_namespace(args, tp, ep, layout)
    # The models as built here: torch's norms refuse sequence parallelism (Apex is not
    # installed), which TransformerConfig requires with TP and EP; without it and with the
    # config's TP left at 1 (the layers take TP from parallel_state) nothing changes in the
    # parameters. The TE files are SequentialMLP's tensors renamed.
    build_args = copy.deepcopy(rank_args)
    build_args.sequence_parallel = False
    build_args.tensor_model_parallel_size = 1
    build_args.transformer_impl = "local"
    build_args.moe_grouped_gemm = layout == "local"
    moe_layers = {l for l in range(args.num_layers) if l % args.moe_layer_freq == 0}
    layer_is_moe = lambda k: int(k.split(".")[2]) in moe_layers  # noqa: E731
    for e in range(ep):
        for t in range(tp):
            model = build(build_args, t, e, tp)
            fill_from_global(model, full)
            sd = model.state_dict_for_save_checkpoint()
            state = {k: seq_file[k] for k in ("checkpoint_version", "iteration", "num_floating_point_operations_so_far",
                                              "opt_param_scheduler", "rerun_state_machine", "rng_state")}
            state["args"] = rank_args
            state["model"] = sd if layout == "local" else te_state_dict(sd, layer_is_moe)
            if layout == "local" and tp == 1 and ep == 1:
                state["optimizer"] = optimizer_state(seq_file, seq_model, build_args)
            folder = os.path.join(out, "iter_%07d" % mcm.ITERATION, mcm.checkpoint_folder(t, 0, 1, e, ep))
            os.makedirs(folder, exist_ok=True)
            torch.save(state, os.path.join(folder, "model_optim_rng.pt"))
    with open(os.path.join(out, "latest_checkpointed_iteration.txt"), "w") as f:
        f.write(str(mcm.ITERATION))
    set_ranks(1, 0, 1, 0)


def check_grouped_forward(grouped, expected):
    """GroupedMLP's own forward of a TP=1 EP=1 file (the gmm stub) against SequentialMLP's logits."""
    it_dir = os.path.join(grouped, "iter_%07d" % mcm.ITERATION, "mp_rank_00")
    saved = torch.load(os.path.join(it_dir, "model_optim_rng.pt"), map_location="cpu", weights_only=False)
    model = mcm.build_model(saved["args"])
    model.load_state_dict(saved["model"], strict=True)
    assert type(model.decoder.layers[0].mlp.experts).__name__ == "GroupedMLP"
    want = mcm.safetensors_io.read(expected)[0]
    tokens = torch.from_numpy(mcm.safetensors_io.array(want["tokens"]).astype("int64"))
    diff = (mcm.forward(model, tokens) - torch.from_numpy(mcm.safetensors_io.array(want["logits"]).copy())).abs()
    print("GroupedMLP's forward of its file against SequentialMLP's logits: max |diff| %.3g" % diff.max().item())
    if diff.max().item() > 1e-5:
        raise SystemExit("GroupedMLP's forward of the grouped file differs from SequentialMLP's")


def save(out, layouts, tp, ep):
    mcm.save(os.path.join(out, "sequential"), mcm.MOE, 1)
    seq_dir = os.path.join(out, "sequential", "iter_%07d" % mcm.ITERATION, "mp_rank_00")
    seq_file = torch.load(os.path.join(seq_dir, "model_optim_rng.pt"), map_location="cpu", weights_only=False)
    seq_model = build(seq_file["args"])
    seq_model.load_state_dict(seq_file["model"], strict=True)
    full = global_tensors(seq_model)
    for layout in layouts:
        grouped = os.path.join(out, "grouped_" + layout)
        save_grouped(grouped, layout, seq_file, seq_model, full, tp, ep)
        if layout == "local" and tp == 1 and ep == 1:
            check_grouped_forward(grouped, os.path.join(out, "sequential", "expected.safetensors"))


def check_ep(ep_dir, one_dir):
    def load(d, folder):
        it = open(os.path.join(d, "latest_checkpointed_iteration.txt")).read().strip()
        return torch.load(os.path.join(d, "iter_%07d" % int(it), folder, "model_optim_rng.pt"), map_location="cpu",
                          weights_only=False)
    one = load(one_dir, "mp_rank_00")["model"]
    first = load(ep_dir, "mp_rank_00_000")
    args = first["args"]
    ep = args.expert_model_parallel_size
    assert args.moe_grouped_gemm and ep > 1, (args.moe_grouped_gemm, ep)
    grouped = [k for k in one if k.endswith(".mlp.experts.weight1") or k.endswith(".mlp.experts.weight2")]
    assert grouped, "the EP=1 save holds no GroupedMLP weights"
    for r in range(ep):
        sd = load(ep_dir, mcm.checkpoint_folder(0, 0, 1, r, ep))["model"]
        build(args, 0, r).load_state_dict(sd, strict=True)
        for k in grouped:
            share = one[k].reshape(-1).chunk(ep)[r]
            if not torch.equal(sd[k].reshape(-1), share):
                raise SystemExit("%s of expert-parallel rank %d is not its share of the EP=1 tensor" % (k, r))
    set_ranks(1, 0, 1, 0)
    print("%d expert-parallel files load strictly; %d grouped tensors split as megatron-core's" % (ep, len(grouped)))


def dist_metadata(folder):
    from torch.distributed.checkpoint import FileSystemReader
    meta = FileSystemReader(folder).read_metadata().state_dict_metadata
    return {k: (tuple(getattr(v, "size", ())), str(getattr(getattr(v, "properties", None), "dtype", "")))
            for k, v in meta.items()}


def dist_save(out):
    import megatron_dist_checkpoint as mdc
    from megatron.core import dist_checkpointing
    mdc.init_cpu_megatron(0, 1, 1, 1, 20000 + os.getpid() % 20000)
    stub_grouped_gemm()
    mdc.save_model(0, 1, 1, 1, os.path.join(out, "sequential"), "moe", False)
    seq_folder = os.path.join(out, "sequential", "iter_%07d" % mdc.ITERATION)
    args = mdc.namespace(mdc.MOE, 1, 1, 1)
    seq = mdc.build_stage(args)
    seq.load_state_dict(dist_checkpointing.load({"model": seq.sharded_state_dict()}, seq_folder)["model"])
    args.moe_grouped_gemm = True
    model = mdc.build_stage(args)
    assert type(model.decoder.layers[0].mlp.experts).__name__ == "GroupedMLP"
    _, optimizer = mdc.megatron_optimizer(args, model)
    state = {"model": model.sharded_state_dict()}
    state["optimizer"] = optimizer.sharded_state_dict(state, is_loading=True)
    loaded = dist_checkpointing.load(state, seq_folder)
    model.load_state_dict(loaded["model"], strict=True)
    optimizer.load_state_dict(loaded["optimizer"])
    tokens = torch.randint(0, args.vocab_size, (mcm.BATCH, mcm.SEQ))
    diff = (mcm.forward(model, tokens) - mcm.forward(seq, tokens)).abs().max().item()
    print("GroupedMLP loaded from SequentialMLP's torch_dist: max |logit diff| %.3g" % diff)
    if diff > 1e-5:
        raise SystemExit("GroupedMLP's forward differs from SequentialMLP's by %g" % diff)
    common = dist_checkpointing.load_common_state_dict(seq_folder)
    state = {k: common[k] for k in ("checkpoint_version", "iteration", "opt_param_scheduler",
                                     "num_floating_point_operations_so_far")}
    state.update(args=args, model=model.sharded_state_dict(), rng_state=mdc.rng_state_object(),
                 rerun_state_machine=mdc.rerun_state_object())
    state["optimizer"] = optimizer.sharded_state_dict(state)
    folder = os.path.join(out, "grouped", "iter_%07d" % mdc.ITERATION)
    os.makedirs(folder)
    dist_checkpointing.save(state, folder)
    with open(os.path.join(out, "grouped", "latest_checkpointed_iteration.txt"), "w") as f:
        f.write(str(mdc.ITERATION))
    a, b = dist_metadata(seq_folder), dist_metadata(folder)
    if a != b:
        raise SystemExit("torch_dist keys of SequentialMLP and GroupedMLP differ: %s"
                         % sorted(set(a.items()) ^ set(b.items()))[:8])
    print("SequentialMLP's and GroupedMLP's torch_dist saves hold the same %d keys" % len(a))


def dist_check(ckpt, expected):
    import megatron_dist_checkpoint as mdc
    from megatron.core import dist_checkpointing
    mdc.init_cpu_megatron(0, 1, 1, 1, 20000 + os.getpid() % 20000)
    stub_grouped_gemm()
    it = int(open(os.path.join(ckpt, "latest_checkpointed_iteration.txt")).read())
    folder = os.path.join(ckpt, "iter_%07d" % it)
    args = dist_checkpointing.load_common_state_dict(folder)["args"]
    assert args.moe_grouped_gemm and args.transformer_impl == "local", (args.moe_grouped_gemm, args.transformer_impl)
    model = mdc.build_stage(args)
    assert type(model.decoder.layers[0].mlp.experts).__name__ == "GroupedMLP"
    model.load_state_dict(dist_checkpointing.load({"model": model.sharded_state_dict()}, folder)["model"], strict=True)
    want = mcm.safetensors_io.read(expected)[0]
    tokens = torch.from_numpy(mcm.safetensors_io.array(want["tokens"]).astype("int64"))
    tessera = torch.from_numpy(mcm.safetensors_io.array(want["logits"]).copy())
    diff = (mcm.forward(model, tokens) - tessera).abs().max().item()
    scale = tessera.abs().max().item()
    print("megatron-core's GroupedMLP model of tessera's torch_dist save: max |diff| %.3g, max |logit| %.3g"
          % (diff, scale))
    if not diff <= 1e-5 * scale:
        raise SystemExit("megatron-core's forward differs from tessera's by %g" % diff)


def main():
    p = argparse.ArgumentParser()
    p.add_argument("action", choices=["save", "check", "check-ep", "dist-save", "dist-check"])
    p.add_argument("paths", nargs="+")
    p.add_argument("--layouts", nargs="+", choices=["local", "te"], default=["local"])
    p.add_argument("--tp", type=int, default=1)
    p.add_argument("--ep", type=int, default=1)
    a = p.parse_args()
    if a.action == "dist-save":
        return dist_save(a.paths[0])
    if a.action == "dist-check":
        return dist_check(a.paths[0], a.paths[1])
    mcm.init_cpu_megatron()
    stub_grouped_gemm()
    if a.action == "save":
        save(a.paths[0], a.layouts, a.tp, a.ep)
    elif a.action == "check":
        mcm.check(a.paths[0], a.paths[1], mcm.MOE)
    else:
        check_ep(a.paths[0], a.paths[1])


if __name__ == "__main__":
    main()
