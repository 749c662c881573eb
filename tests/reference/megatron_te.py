#!/usr/bin/env python3
"""megatron-core 0.10.0's Transformer Engine layer spec (get_gpt_layer_with_transformer_engine_spec,
what pretrain_gpt.py builds for Megatron's default --transformer-impl transformer_engine) as the
reference for tessera's Megatron files in that layout (src/tessera/ckpt/megatron_layer_spec.h).
Transformer Engine itself is NOT run: it needs CUDA to build or import, and transformer_engine_stub.py
stands in for the few of its classes megatron-core imports (parameters, registration order and
extra state as TE 1.13 defines them; no forward). Everything else is megatron-core's own code on the
CPU, as in megatron_core_models.py (tools venv) and megatron_dist_checkpoint.py (tdist venv).

    python megatron_te.py save OUT gpt|moe         (tools venv)
writes what Megatron's save_checkpoint (--ckpt-format torch) writes for megatron-core's GPTModel of
the TE spec (pretrain_gpt.py's: get_gpt_decoder_block_spec for MoE, whose MoE layers keep a TENorm
pre_mlp_layernorm, TE linears for the shared experts and SequentialMLP's local linears for the
experts), a tiny GPT (LayerNorm, biases, learned positions, tied embeddings) or megatron_core_models.py's
MoE Llama, with random weights:
OUT/iter_0000007/mp_rank_00/model_optim_rng.pt holding args (transformer_impl 'transformer_engine'),
checkpoint_version, iteration and model (its state_dict_for_save_checkpoint(): TE's fused norm
names, an io.BytesIO _extra_state per TE module, final_layernorm's empty tensor), and
OUT/latest_checkpointed_iteration.txt.

    python megatron_te.py check DIR SRC            (tools venv)
tessera's --ckpt-format torch save DIR of SRC's model at any TP/PP: each (tp, pp) rank's file loads
with load_state_dict(strict=True) into that rank's TE GPTModel (parallel_state's sizes and ranks
set through its setters), its model keys come in the order of the model's own state_dict(), each
_extra_state has the type the model's module saves, every tensor equals the rank's slice of SRC's,
and an optimizer state's parameters follow the TE model's parameter groups (each moment shaped as
the parameter at its place). Exits 1 naming the first difference.

    python megatron_te.py dist-check DIR SRC       (tdist venv)
tessera's torch_dist save DIR loads with megatron-core's dist_checkpointing.load into the TE
GPTModel's sharded_state_dict() (one process, strict: every key and ShardedObject the model asks
for must be there), then load_state_dict(strict=True), and every tensor equals SRC's.
"""
import io
import os
import sys

import torch

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, HERE)
import transformer_engine_stub  # noqa: E402

transformer_engine_stub.install()  # before megatron.core is imported
import megatron_core_models as mcm  # noqa: E402

ITERATION = mcm.ITERATION
# megatron_core_models.py's tiny GPT with 4 layers, so that PP 2 stages hold 2 each, and its MoE
# Llama (SwiGLU, RMSNorm, GQA, MoE every second layer with shared experts).
RUNS = dict(gpt=dict(mcm.GPT, num_layers=4, transformer_impl="transformer_engine"),
            moe=dict(mcm.MOE, transformer_impl="transformer_engine"))
COLUMN = ("embedding.word_embeddings.weight", "linear_qkv.weight", "linear_qkv.bias", "linear_fc1.weight",
          "linear_fc1.bias", "output_layer.weight")
ROW = ("linear_proj.weight", "linear_fc2.weight")


def set_ranks(tp, tp_rank, pp, pp_rank):
    from megatron.core import parallel_state as ps
    ps.set_tensor_model_parallel_world_size(tp)
    ps.set_tensor_model_parallel_rank(tp_rank)
    ps.set_expert_tensor_parallel_world_size(tp)
    ps.set_expert_tensor_parallel_rank(tp_rank)
    ps.set_pipeline_model_parallel_world_size(pp)
    ps.set_pipeline_model_parallel_rank(pp_rank)


def build_te_model(args, pp_rank=0):
    """pretrain_gpt.py model_provider (core_r0.10.0) with --transformer-impl transformer_engine, as
    pipeline stage pp_rank builds it."""
    from megatron.core.models.gpt import GPTModel
    from megatron.core.models.gpt.gpt_layer_specs import (get_gpt_decoder_block_spec,
                                                          get_gpt_layer_with_transformer_engine_spec)
    assert args.transformer_impl == "transformer_engine"
    config = mcm.config_from_args(args)
    if args.num_experts:
        spec = get_gpt_decoder_block_spec(config, use_transformer_engine=True)
    else:
        spec = get_gpt_layer_with_transformer_engine_spec(args.num_experts, args.moe_grouped_gemm, args.qk_layernorm,
                                                          args.multi_latent_attention, args.fp8)
    pp = args.pipeline_model_parallel_size
    return GPTModel(config=config, transformer_layer_spec=spec, vocab_size=args.padded_vocab_size,
                    max_sequence_length=args.max_position_embeddings, pre_process=pp_rank == 0,
                    post_process=pp_rank == pp - 1, fp16_lm_cross_entropy=args.fp16_lm_cross_entropy,
                    parallel_output=True,
                    share_embeddings_and_output_weights=not args.untie_embeddings_and_output_weights,
                    position_embedding_type=args.position_embedding_type, rotary_percent=args.rotary_percent,
                    rotary_base=args.rotary_base, rope_scaling=args.use_rope_scaling)


def save(out, model_name):
    mcm.init_cpu_megatron()
    args = mcm.saved_namespace(RUNS[model_name])
    torch.manual_seed(5)
    model = build_te_model(args)
    with torch.no_grad():
        for p in model.parameters():
            p.copy_(torch.randn_like(p) * 0.5)
    folder = os.path.join(out, "iter_%07d" % ITERATION, "mp_rank_00")
    os.makedirs(folder)
    torch.save({"args": args, "checkpoint_version": 3.0, "iteration": ITERATION,
                "model": model.state_dict_for_save_checkpoint()}, os.path.join(folder, "model_optim_rng.pt"))
    with open(os.path.join(out, "latest_checkpointed_iteration.txt"), "w") as f:
        f.write(str(ITERATION))


def source_tensors(src):
    it_dir = os.path.join(src, "iter_%07d" % ITERATION, "mp_rank_00", "model_optim_rng.pt")
    sd = torch.load(it_dir, map_location="cpu", weights_only=False)["model"]
    return {k: v for k, v in sd.items() if "_extra_state" not in k}


def rank_slice(name, t, tp, tp_rank, swiglu):
    """The (tp_rank)th of tp parts of global tensor t as Megatron splits parameter `name`: SwiGLU's
    fc1 [gate; up] as the rank's [gate_r; up_r]."""
    if swiglu and name.endswith(("linear_fc1.weight", "linear_fc1.bias")):
        return torch.cat([half.chunk(tp, 0)[tp_rank] for half in t.chunk(2, 0)])
    if name.endswith(COLUMN):
        return t.chunk(tp, 0)[tp_rank]
    if name.endswith(ROW):
        return t.chunk(tp, 1)[tp_rank]
    return t


def global_name(name, first_layer):
    parts = name.split(".")
    if name.startswith("decoder.layers."):
        parts[2] = str(int(parts[2]) + first_layer)
    return ".".join(parts)


def extra_state_type(value):
    return "None" if value is None else type(value).__name__


def check_optimizer_order(path, optimizer, model):
    """torch's optimizer state follows Megatron's parameter groups of the TE model
    (megatron_core_models.megatron_param_groups: its named_parameters() order): each index's
    moments are shaped as the parameter at its place."""
    inner = optimizer.get("optimizer", optimizer)
    for group, saved in zip(mcm.megatron_param_groups(model), inner["param_groups"]):
        if len(group["params"]) != len(saved["params"]):
            raise SystemExit("%s: an optimizer group holds %d parameters, the TE model's %d"
                             % (path, len(saved["params"]), len(group["params"])))
        for p, index in zip(group["params"], saved["params"]):
            if inner["state"][index]["exp_avg"].shape != p.shape:
                raise SystemExit("%s: optimizer parameter %d is shaped %s, the TE model's parameter there %s"
                                 % (path, index, tuple(inner["state"][index]["exp_avg"].shape), tuple(p.shape)))


def check_rank(path, args, tp_rank, pp_rank, want):
    tp, pp = args.tensor_model_parallel_size, args.pipeline_model_parallel_size
    set_ranks(tp, tp_rank, pp, pp_rank)
    model = build_te_model(args, pp_rank)
    own = model.state_dict()
    file = torch.load(path, map_location="cpu", weights_only=False)
    saved = file["model"]
    if list(saved) != list(own):
        raise SystemExit("%s: the model keys differ from megatron-core's TE model's:\n  saved %s\n  model %s"
                         % (path, list(saved), list(own)))
    for k, v in own.items():
        if k.endswith("_extra_state") and extra_state_type(saved[k]) != extra_state_type(v):
            raise SystemExit("%s: %s is %s, the TE model's module saves %s"
                             % (path, k, extra_state_type(saved[k]), extra_state_type(v)))
    model.load_state_dict(saved, strict=True)
    if "optimizer" in file:
        check_optimizer_order(path, file["optimizer"], model)
    first_layer = pp_rank * args.num_layers // pp
    for name, p in model.state_dict().items():
        if "_extra_state" in name:
            continue
        g = global_name(name, first_layer)
        source = want["embedding.word_embeddings.weight" if g == "output_layer.weight" and g not in want else g]
        if not torch.equal(p, rank_slice(g, source, tp, tp_rank, args.swiglu)):
            raise SystemExit("%s: %s differs from the source checkpoint's" % (path, name))
    return len(own)


def check(ckpt, src):
    mcm.init_cpu_megatron()
    # The tied output layer's copy on a last stage (LanguageModule.setup_embeddings_and_output_layer)
    # is moved to the GPU before its all-reduce: it stays on the CPU.
    torch.Tensor.cuda = lambda self, *a, **k: self
    want = source_tensors(src)
    it_dir = os.path.join(ckpt, "iter_%07d" % int(open(os.path.join(ckpt, "latest_checkpointed_iteration.txt")).read()))
    first = torch.load(os.path.join(it_dir, sorted(os.listdir(it_dir))[0], "model_optim_rng.pt"), map_location="cpu",
                       weights_only=False)["args"]
    if first.transformer_impl != "transformer_engine":
        raise SystemExit("args.transformer_impl is %r" % first.transformer_impl)
    tp, pp = first.tensor_model_parallel_size, first.pipeline_model_parallel_size
    entries = 0
    for pp_rank in range(pp):
        for tp_rank in range(tp):
            folder = mcm.checkpoint_folder(tp_rank, pp_rank, pp, 0, 1)
            entries += check_rank(os.path.join(it_dir, folder, "model_optim_rng.pt"), first, tp_rank, pp_rank, want)
    print("TP=%d PP=%d: %d files, %d state-dict entries load strictly into megatron-core's TE GPTModel"
          % (tp, pp, tp * pp, entries))


def dist_check(ckpt, src):
    import megatron_dist_checkpoint as mdc
    from megatron.core import dist_checkpointing
    mdc.init_cpu_megatron(0, 1, 1, 1, 20000 + os.getpid() % 20000)
    want = source_tensors(src)
    it_dir = os.path.join(ckpt, "iter_%07d" % int(open(os.path.join(ckpt, "latest_checkpointed_iteration.txt")).read()))
    common = torch.load(os.path.join(it_dir, "common.pt"), map_location="cpu", weights_only=False)
    args = common["args"]
    if args.transformer_impl != "transformer_engine":
        raise SystemExit("args.transformer_impl is %r" % args.transformer_impl)
    args.tensor_model_parallel_size = args.pipeline_model_parallel_size = 1
    model = build_te_model(args)
    # megatron/training/checkpointing.py load_checkpoint: the model's part under 'model'.
    loaded = dist_checkpointing.load({"model": model.sharded_state_dict()}, it_dir)["model"]
    model.load_state_dict(loaded, strict=True)
    for name, p in model.state_dict().items():
        if "_extra_state" in name:
            continue
        if not torch.equal(p, want[name]):
            raise SystemExit("%s differs from the source checkpoint's" % name)
    extra = [k for k, v in loaded.items() if k.endswith("_extra_state")]
    if any(not isinstance(loaded[k], (io.BytesIO, torch.Tensor, type(None))) for k in extra):
        raise SystemExit("an _extra_state of an unexpected type: %s" % {k: type(loaded[k]) for k in extra})
    print("torch_dist: %d tensors and %d _extra_state objects load strictly into megatron-core's TE GPTModel"
          % (len(loaded) - len(extra), len(extra)))


def main():
    action, *rest = sys.argv[1:]
    {"save": save, "check": check, "dist-check": dist_check}[action](*rest)


if __name__ == "__main__":
    main()
