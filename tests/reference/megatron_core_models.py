#!/usr/bin/env python3
"""megatron-core 0.10.0's own GPTModel as the reference for Megatron-LM checkpoints, both ways.
Runs in the tools venv (torch 2.6, numpy<2, megatron-core 0.10.0) on the CPU: gloo, world size
1, the local layer spec. What needs CUDA is stubbed, and nothing else: torch.cuda.current_device
("cpu"), torch.cuda.synchronize (a no-op) and the CUDA RNG tracker's fork (a null context; no
model_parallel_cuda_manual_seed). The kernels' CUDA-only fusions are off in the config
(rope, bias-dropout, masked softmax, gradient accumulation, apex's persistent LayerNorm), which
leaves the arithmetic as it is; the bias-GELU fusion (tanh GELU) runs on the CPU and stays as
the Namespace says.

    python megatron_core_models.py save OUT --model gpt|llama
writes megatron-core's model (random weights: biases and norms too) as Megatron's
save_checkpoint does with --ckpt-format torch (megatron/training/checkpointing.py
generate_state_dict, core_r0.10.0): OUT/latest_checkpointed_iteration.txt "7" and
OUT/iter_0000007/mp_rank_00/model_optim_rng.pt holding args (the Namespace with every attribute
of tests/ckpt_area/megatron_namespace_dests.txt: Megatron's defaults, this run's values),
checkpoint_version 3.0, iteration, model (the model's own state_dict_for_save_checkpoint(): an
OrderedDict with _metadata), optimizer (torch's AdamW after one step, Megatron's two parameter
groups), opt_param_scheduler (megatron-core's OptimizerParamScheduler), rerun_state_machine
(megatron-core's), rng_state (random, numpy, torch; the CPU generator's state stands in for
CUDA's), num_floating_point_operations_so_far; and OUT/expected.safetensors: tokens I32 [2, 16]
and megatron-core's forward logits F32 [2, 16, V].

    python megatron_core_models.py check DIR EXPECTED --model gpt|llama
reads tessera's --ckpt-format torch save DIR (one rank, torch.load weights_only=False), checks
that its Namespace's attributes are exactly megatron_namespace_dests.txt and the values loaders
read, builds GPTModel from the Namespace as pretrain_gpt.py's model_provider does
(core_transformer_config_from_args, restated below), loads the model with strict=True and
compares its forward of EXPECTED's tokens with EXPECTED's logits (tessera's) within 1e-5 of the
largest logit. Exits 1 naming the first difference.
"""
import argparse
import contextlib
import dataclasses
import json
import os
import random
import sys

import numpy as np
import torch
import torch.nn.functional as F

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, HERE)
import safetensors_io  # noqa: E402

ROOT = os.path.join(HERE, "..", "..")
DESTS = os.path.join(ROOT, "tests", "ckpt_area", "megatron_namespace_dests.txt")
DEFAULTS = os.path.join(ROOT, "src", "tessera", "train", "megatron_namespace.inc")
ITERATION, BATCH, SEQ = 7, 2, 16

# The runs (Megatron's attribute names), as `tessera train` flags would give them.
GPT = dict(num_layers=2, hidden_size=32, num_attention_heads=4, seq_length=SEQ, max_position_embeddings=SEQ,
           tokenizer_type="NullTokenizer", vocab_size=99, make_vocab_size_divisible_by=64, padded_vocab_size=128,
           hidden_dropout=0.0, attention_dropout=0.0, micro_batch_size=1, global_batch_size=8, train_iters=20,
           lr=1e-3, min_lr=1e-4, ckpt_format="torch", transformer_impl="local")
LLAMA = dict(GPT, num_query_groups=2, group_query_attention=True, kv_channels=8, ffn_hidden_size=64, swiglu=True,
             normalization="RMSNorm", norm_epsilon=1e-5, position_embedding_type="rope", rotary_base=500000,
             add_bias_linear=False, untie_embeddings_and_output_weights=True)


def read_dests():
    return [l.strip() for l in open(DESTS) if l.strip() and not l.startswith("#")]


def megatron_defaults():
    """The parser's defaults, as tests/reference/megatron_namespace.py recorded them."""
    out = {}
    for line in open(DEFAULTS):
        if line.startswith("MEGATRON_DEST("):
            name, default = json.loads("[" + line[len("MEGATRON_DEST("):line.rindex(")")] + "]")
            out[name] = json.loads(default)
    return out


def saved_namespace(run):
    """The Namespace Megatron's training saves for `run`: the parser's defaults, the run's
    flags, and what validate_args and training set (megatron/training/arguments.py,
    training.py)."""
    a = argparse.Namespace(**megatron_defaults())
    a.__dict__.update(run)
    from megatron.core.enums import ModelType
    ffn = run.get("ffn_hidden_size") or 4 * run["hidden_size"]
    a.__dict__.update(
        rank=0, world_size=1, use_dist_ckpt=False, transformer_pipeline_model_parallel_size=1, data_parallel_size=1,
        expert_tensor_parallel_size=1, overlap_p2p_comm=False, align_param_gather=False, params_dtype=torch.float32,
        dataloader_type="single", variable_seq_lengths=False, encoder_num_layers=run["num_layers"],
        ffn_hidden_size=ffn, kv_channels=run.get("kv_channels") or run["hidden_size"] // run["num_attention_heads"],
        encoder_seq_length=run["seq_length"], start_weight_decay=a.weight_decay, end_weight_decay=a.weight_decay,
        sequence_parallel=False, num_experts=None, moe_ffn_hidden_size=ffn, lr_decay_iters=run["train_iters"],
        model_type=ModelType.encoder_or_decoder, consumed_train_samples=ITERATION * run["global_batch_size"],
        consumed_valid_samples=0, skipped_train_samples=0, iteration=ITERATION, curr_iteration=ITERATION - 1,
        num_floating_point_operations_so_far=1.5e9, do_train=1, do_valid=1, do_test=1)
    if not a.add_bias_linear:
        a.bias_gelu_fusion = False
    else:
        a.add_qkv_bias = True
    if a.position_embedding_type != "rope":
        a.apply_rope_fusion = False
    if not a.group_query_attention:
        a.num_query_groups = a.num_attention_heads
    return a


def init_cpu_megatron():
    """gloo at world size 1 and the three CUDA stubs."""
    torch.cuda.current_device = lambda: "cpu"
    torch.cuda.synchronize = lambda *a, **k: None
    import torch.distributed as dist
    from megatron.core import parallel_state
    from megatron.core.tensor_parallel import random as tp_random
    tp_random.CudaRNGStatesTracker.fork = lambda self, name="model-parallel-rng": contextlib.nullcontext()
    os.environ.setdefault("MASTER_ADDR", "127.0.0.1")
    os.environ.setdefault("MASTER_PORT", str(20000 + os.getpid() % 20000))
    dist.init_process_group("gloo", rank=0, world_size=1)
    parallel_state.initialize_model_parallel(1, 1)


def config_from_args(args):
    """megatron/training/arguments.py core_transformer_config_from_args (core_r0.10.0), for the
    settings a dense local-spec GPT holds, then the CPU's fusions off."""
    from megatron.core.transformer import TransformerConfig
    kw = {f.name: getattr(args, f.name) for f in dataclasses.fields(TransformerConfig) if hasattr(args, f.name)}
    kw.update(persist_layer_norm=not args.no_persist_layer_norm, layernorm_zero_centered_gamma=args.apply_layernorm_1p,
              layernorm_epsilon=args.norm_epsilon, deallocate_pipeline_outputs=True, pipeline_dtype=args.params_dtype,
              batch_p2p_comm=not args.overlap_p2p_comm, num_moe_experts=args.num_experts,
              rotary_interleaved=args.rotary_interleaved,
              first_pipeline_num_layers=args.decoder_first_pipeline_num_layers,
              last_pipeline_num_layers=args.decoder_last_pipeline_num_layers,
              num_query_groups=args.num_query_groups if args.group_query_attention else None,
              config_logger_dir=args.config_logger_dir)
    if args.swiglu:
        kw.update(activation_func=F.silu, gated_linear_unit=True, bias_activation_fusion=args.bias_swiglu_fusion)
    else:
        kw.update(bias_activation_fusion=args.bias_gelu_fusion)
    if len(args.cp_comm_type) == 1:
        kw["cp_comm_type"] = args.cp_comm_type[0]
    kw.update(use_cpu_initialization=True, persist_layer_norm=False, apply_rope_fusion=False, bias_dropout_fusion=False,
              masked_softmax_fusion=False, gradient_accumulation_fusion=False)
    return TransformerConfig(**kw)


def build_model(args):
    """pretrain_gpt.py model_provider (core_r0.10.0) with --transformer-impl local."""
    from megatron.core.models.gpt import GPTModel
    from megatron.core.models.gpt.gpt_layer_specs import get_gpt_layer_local_spec
    assert not args.use_legacy_models and args.transformer_impl == "local" and args.spec is None
    config = config_from_args(args)
    spec = get_gpt_layer_local_spec(args.num_experts, args.moe_grouped_gemm, args.qk_layernorm,
                                    args.multi_latent_attention)
    return GPTModel(config=config, transformer_layer_spec=spec, vocab_size=args.padded_vocab_size,
                    max_sequence_length=args.max_position_embeddings, pre_process=True, post_process=True,
                    fp16_lm_cross_entropy=args.fp16_lm_cross_entropy, parallel_output=True,
                    share_embeddings_and_output_weights=not args.untie_embeddings_and_output_weights,
                    position_embedding_type=args.position_embedding_type, rotary_percent=args.rotary_percent,
                    rotary_base=args.rotary_base, rope_scaling=args.use_rope_scaling)


def forward(model, tokens):
    """Logits [b, s, V] of megatron-core's forward with Megatron's causal mask (True: masked)."""
    b, s = tokens.shape
    position_ids = torch.arange(s).unsqueeze(0).expand(b, s)
    mask = torch.triu(torch.ones(1, 1, s, s), diagonal=1).bool()
    model.eval()
    with torch.no_grad():
        return model(tokens, position_ids, mask).float()


def megatron_param_groups(model):
    """megatron/core/optimizer/__init__.py _get_param_groups: weight decay except biases and 1-D
    parameters, one group per class in order of first appearance."""
    decay, no_decay = [], []
    for name, p in model.named_parameters():
        (no_decay if name.endswith(".bias") or p.dim() == 1 else decay).append(p)
    return [dict(params=decay, weight_decay=0.1, wd_mult=1.0, lr_mult=1.0, is_expert_parallel=False,
                 is_decoupled_lr=False),
            dict(params=no_decay, weight_decay=0.0, wd_mult=0.0, lr_mult=1.0, is_expert_parallel=False,
                 is_decoupled_lr=False)]


def save(out, run):
    from megatron.core.optimizer_param_scheduler import OptimizerParamScheduler
    from megatron.core.rerun_state_machine import get_rerun_state_machine
    from megatron.core.tensor_parallel import get_cuda_rng_tracker
    torch.manual_seed(7)
    random.seed(7)
    np.random.seed(7)
    args = saved_namespace(run)
    model = build_model(args)
    with torch.no_grad():  # every parameter random, so that biases and norms matter
        for name, p in model.named_parameters():
            p.copy_(1.0 + 0.1 * torch.randn_like(p) if "layernorm" in name else 0.05 * torch.randn_like(p))
    optimizer = torch.optim.AdamW(megatron_param_groups(model), lr=args.lr)
    for p in model.parameters():
        p.grad = 1e-3 * torch.randn_like(p)
    optimizer.step()
    scheduler = OptimizerParamScheduler(optimizer, 0.0, args.lr, args.min_lr, 1, args.train_iters, "cosine", 0.1, 0.1,
                                        args.train_iters, "constant")
    scheduler.step(ITERATION * args.global_batch_size)
    tracker_states = get_cuda_rng_tracker().get_states() or {"model-parallel-rng": torch.get_rng_state()}
    rng_state = [{"random_rng_state": random.getstate(), "np_rng_state": np.random.get_state(),
                  "torch_rng_state": torch.get_rng_state(), "cuda_rng_state": torch.get_rng_state(),
                  "rng_tracker_states": tracker_states}]
    state_dict = {"args": args, "checkpoint_version": 3.0, "iteration": ITERATION,
                  "model": model.state_dict_for_save_checkpoint(), "optimizer": optimizer.state_dict(),
                  "opt_param_scheduler": scheduler.state_dict(),
                  "rerun_state_machine": get_rerun_state_machine().state_dict(data_iterator=None,
                                                                              use_dist_ckpt=False),
                  "rng_state": rng_state, "num_floating_point_operations_so_far": 1.5e9}
    assert hasattr(state_dict["model"], "_metadata")
    folder = os.path.join(out, "iter_%07d" % ITERATION, "mp_rank_00")
    os.makedirs(folder, exist_ok=True)
    torch.save(state_dict, os.path.join(folder, "model_optim_rng.pt"))
    with open(os.path.join(out, "latest_checkpointed_iteration.txt"), "w") as f:
        f.write(str(ITERATION))
    tokens = torch.randint(0, run["vocab_size"] + 1, (BATCH, SEQ))
    logits = forward(model, tokens)
    safetensors_io.write(os.path.join(out, "expected.safetensors"),
                         [("tokens", "I32", tokens.numpy()), ("logits", "F32", logits.numpy())])


def check_namespace(ns, run):
    names, dests = set(vars(ns)), set(read_dests())
    if names != dests:
        raise SystemExit("the Namespace's attributes differ from Megatron's: extra %s, missing %s"
                         % (sorted(names - dests), sorted(dests - names)))
    gqa = run.get("group_query_attention", False)
    want = dict(add_bias_linear=run.get("add_bias_linear", True), add_qkv_bias=run.get("add_bias_linear", True),
                swiglu=run.get("swiglu", False), normalization=run.get("normalization", "LayerNorm"),
                position_embedding_type=run.get("position_embedding_type", "learned_absolute"),
                params_dtype=torch.float32, padded_vocab_size=run["padded_vocab_size"],
                num_query_groups=run["num_query_groups"] if gqa else run["num_attention_heads"],
                group_query_attention=gqa, rotary_base=run.get("rotary_base", 10000),
                untie_embeddings_and_output_weights=run.get("untie_embeddings_and_output_weights", False),
                use_legacy_models=False, ckpt_format="torch", tensor_model_parallel_size=1,
                pipeline_model_parallel_size=1, data_parallel_size=1, use_rope_scaling=False,
                transformer_impl="local")
    for k, v in want.items():
        if getattr(ns, k) != v or type(getattr(ns, k)) is not type(v):
            raise SystemExit("args.%s is %r, Megatron holds %r for this run" % (k, getattr(ns, k), v))


def check(ckpt, expected, run):
    tracker = open(os.path.join(ckpt, "latest_checkpointed_iteration.txt")).read().strip()
    path = os.path.join(ckpt, "iter_%07d" % int(tracker), "mp_rank_00", "model_optim_rng.pt")
    sd = torch.load(path, map_location="cpu", weights_only=False)
    check_namespace(sd["args"], run)
    model = build_model(sd["args"])
    model.load_state_dict(sd["model"], strict=True)
    want = safetensors_io.read(expected)[0]
    tokens = torch.from_numpy(safetensors_io.array(want["tokens"]).astype(np.int64))
    tessera = torch.from_numpy(safetensors_io.array(want["logits"]).copy())
    logits = forward(model, tokens)
    diff = (logits - tessera).abs().max().item()
    scale = tessera.abs().max().item()
    print("megatron-core's logits against tessera's: max |diff| %.3g, max |logit| %.3g" % (diff, scale))
    if not diff <= 1e-5 * scale:
        raise SystemExit("megatron-core's forward of tessera's save differs from tessera's by %g" % diff)


def main():
    p = argparse.ArgumentParser()
    p.add_argument("action", choices=["save", "check"])
    p.add_argument("paths", nargs="+")
    p.add_argument("--model", choices=["gpt", "llama"], required=True)
    a = p.parse_args()
    run = GPT if a.model == "gpt" else LLAMA
    init_cpu_megatron()
    if a.action == "save":
        save(a.paths[0], run)
    else:
        check(a.paths[0], a.paths[1], run)


if __name__ == "__main__":
    main()
