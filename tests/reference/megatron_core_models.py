#!/usr/bin/env python3
"""megatron-core 0.10.0's own GPTModel as the reference for Megatron-LM checkpoints, both ways.
Runs in the tools venv (torch 2.6, numpy<2, megatron-core 0.10.0) on the CPU: gloo, world size
1, the local layer spec. What needs CUDA is stubbed, and nothing else: torch.cuda.current_device
("cpu"), torch.cuda.synchronize (a no-op) and the CUDA RNG tracker's fork (a null context; no
model_parallel_cuda_manual_seed). The kernels' CUDA-only fusions are off in the config
(rope, bias-dropout, masked softmax, gradient accumulation, apex's persistent LayerNorm), which
leaves the arithmetic as it is; the bias-GELU fusion (tanh GELU) runs on the CPU and stays as
the Namespace says.

    python megatron_core_models.py save OUT --model gpt|llama|moe [--ep N]
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

With --model moe (the Llama with 4 SwiGLU experts, top-2, MoE every second layer
(--moe-layer-freq 2) and shared experts: get_gpt_decoder_block_spec, as pretrain_gpt.py builds
MoE models, its MoE layers the local spec's SequentialMLP) and --ep N, the files are those of
expert-parallel ranks 0..N-1, OUT/iter_0000007/mp_rank_00_EEE/model_optim_rng.pt as
get_checkpoint_name names them, each the state dict of megatron-core's GPTModel as that rank
builds it (parallel_state's expert-parallel size and rank set through its own setters: local
experts 0..E/N-1) holding the EP=1 model's weights, and as `optimizer` the state_dict() of the
optimizer megatron-core's get_megatron_optimizer builds for that model (a ChainedOptimizer of a
dense and an expert FP32Optimizer, over torch's AdamW, Megatron's fallback without Apex or
Transformer Engine) after one step of its inner optimizers with the EP=1 model's gradients;
expected.safetensors then also holds that state by the EP=1 model's names ("exp_avg.NAME",
"exp_avg_sq.NAME").

    python megatron_core_models.py check DIR EXPECTED --model gpt|llama|moe
reads tessera's --ckpt-format torch save DIR (one rank, torch.load weights_only=False), checks
that its Namespace's attributes are exactly megatron_namespace_dests.txt and the values loaders
read, builds GPTModel from the Namespace as pretrain_gpt.py's model_provider does
(core_transformer_config_from_args, restated below), loads the model with strict=True and
compares its forward of EXPECTED's tokens with EXPECTED's logits (tessera's) within 1e-5 of the
largest logit. Exits 1 naming the first difference. A checkpoint saved at expert parallelism
N > 1 loads strictly, file by file, into each rank's model; the replicated parameters must be
equal across the files, and the experts, numbered globally, make the EP=1 model whose logits are
compared.

    python megatron_core_models.py check-optimizer DIR TESSERA_DIR --model moe
checks tessera's --ckpt-format torch save DIR made at expert parallelism N > 1 against the
optimizer megatron-core builds for each rank's model (get_megatron_optimizer from the saved
Namespace, as megatron/training/training.py setup_model_and_optimizer does): the file's
`optimizer` is its ChainedOptimizer's state_dict() structure (a list of the dense and the expert
optimizer's, each with its parameter groups' keys, values and parameter indices; weight decay as
the scheduler sets it, weight_decay x wd_mult), ChainedOptimizer.load_state_dict takes it, and
then every parameter's exp_avg and exp_avg_sq in megatron-core's optimizer equal, bit for bit,
tessera's own save TESSERA_DIR (--ckpt-format tessera) of the same run, found by the
parameter's EP=1 name; with --bf16 each optimizer's fp32_from_fp16_params hold tessera's fp32
main parameters (checked against its groups, as Float16OptimizerWithFloat16Params needs CUDA).
With --use-distributed-optimizer each element is the distributed optimizer's state_dict: the
same groups without params, with the step.
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
MOE = dict(LLAMA, num_experts=4, moe_router_topk=2, moe_layer_freq=2, moe_shared_expert_intermediate_size=32,
           moe_aux_loss_coeff=0.01)
RUNS = dict(gpt=GPT, llama=LLAMA, moe=MOE)


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


def saved_namespace(run, ep=1):
    """The Namespace Megatron's training saves for `run`: the parser's defaults, the run's
    flags, and what validate_args and training set (megatron/training/arguments.py,
    training.py)."""
    a = argparse.Namespace(**megatron_defaults())
    a.__dict__.update(run)
    from megatron.core.enums import ModelType
    ffn = run.get("ffn_hidden_size") or 4 * run["hidden_size"]
    a.__dict__.update(
        rank=0, world_size=ep, use_dist_ckpt=False, transformer_pipeline_model_parallel_size=1, data_parallel_size=ep,
        expert_tensor_parallel_size=1, overlap_p2p_comm=False, align_param_gather=False, params_dtype=torch.float32,
        dataloader_type="single", variable_seq_lengths=False, encoder_num_layers=run["num_layers"],
        ffn_hidden_size=ffn, kv_channels=run.get("kv_channels") or run["hidden_size"] // run["num_attention_heads"],
        encoder_seq_length=run["seq_length"], start_weight_decay=a.weight_decay, end_weight_decay=a.weight_decay,
        sequence_parallel=False, num_experts=run.get("num_experts"), moe_ffn_hidden_size=ffn,
        expert_model_parallel_size=ep, lr_decay_iters=run["train_iters"],
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


def local_moe_spec():
    """core_r0.10.0's _get_mlp_module_spec asks _get_moe_module_spec for use_te=True whatever the
    spec, which names Transformer Engine's classes, undefined without TE; the local spec's
    use_te=False gives the SequentialMLP of ColumnParallelLinear/RowParallelLinear experts that
    the same function picks without grouped GEMM or fp8 anyway."""
    from megatron.core.models.gpt import gpt_layer_specs
    moe_spec = gpt_layer_specs._get_moe_module_spec
    if getattr(moe_spec, "local", False):
        return
    local = lambda use_te=True, **kw: moe_spec(use_te=False, **kw)  # noqa: E731
    local.local = True
    gpt_layer_specs._get_moe_module_spec = local


def build_model(args, ep_rank=0):
    """pretrain_gpt.py model_provider (core_r0.10.0) with --transformer-impl local, as expert-
    parallel rank ep_rank of args.expert_model_parallel_size builds it."""
    from megatron.core import parallel_state
    from megatron.core.models.gpt import GPTModel
    from megatron.core.models.gpt.gpt_layer_specs import get_gpt_decoder_block_spec, get_gpt_layer_local_spec
    assert not args.use_legacy_models and args.transformer_impl == "local" and args.spec is None
    parallel_state.set_expert_model_parallel_world_size(args.expert_model_parallel_size)
    parallel_state.set_expert_model_parallel_rank(ep_rank)
    config = config_from_args(args)
    if args.num_experts:
        local_moe_spec()
        spec = get_gpt_decoder_block_spec(config, use_transformer_engine=False)
    else:
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


@contextlib.contextmanager
def cuda_tensors_on_cpu():
    """FP32Optimizer makes its loss scale of 1 with torch.tensor(..., device='cuda'): made on the
    CPU while megatron-core builds its optimizer."""
    real = torch.tensor

    def tensor(*a, device=None, **k):
        return real(*a, device="cpu" if device == "cuda" else device, **k)
    torch.tensor = tensor
    try:
        yield
    finally:
        torch.tensor = real


def megatron_optimizer(args, model):
    """megatron/training/training.py setup_model_and_optimizer (core_r0.10.0): OptimizerConfig
    from the Namespace's fields, then megatron-core's get_megatron_optimizer for the model, which
    chains a dense and an expert optimizer when the experts' parameters are allreduce=False
    (expert parallelism above 1). Built as fp32 and not distributed (Float16OptimizerWithFloat16Params
    and DistributedOptimizer need CUDA): the groups are the same."""
    from megatron.core.optimizer import OptimizerConfig, get_megatron_optimizer
    kw = {f.name: getattr(args, f.name) for f in dataclasses.fields(OptimizerConfig) if hasattr(args, f.name)}
    kw.update(bf16=False, fp16=False, params_dtype=torch.float32, use_distributed_optimizer=False)
    with cuda_tensors_on_cpu():
        return get_megatron_optimizer(OptimizerConfig(**kw), [model])


def chained_params(optimizer):
    """Each chained optimizer's torch optimizer and its parameters in its groups' order (its
    state_dict's indices)."""
    return [(o.optimizer, [p for g in o.optimizer.param_groups for p in g["params"]])
            for o in optimizer.chained_optimizers]


def checkpoint_folder(tp_rank, pp_rank, pp, ep_rank, ep):
    """megatron/training/checkpointing.py get_checkpoint_name (core_r0.10.0)."""
    folder = "mp_rank_%02d" % tp_rank if pp == 1 else "mp_rank_%02d_%03d" % (tp_rank, pp_rank)
    return folder + ("_%03d" % ep_rank if ep > 1 else "")


def expert_rank_name(name, ep_rank, local_experts):
    """The EP=1 model's name of expert-parallel rank ep_rank's parameter `name` (its local expert
    j is expert ep_rank * local_experts + j: megatron/core/transformer/moe/moe_layer.py)."""
    head, sep, tail = name.partition(".mlp.experts.local_experts.")
    if not sep:
        return name
    j, rest = tail.split(".", 1)
    return "%s%s%d.%s" % (head, sep, ep_rank * local_experts + int(j), rest)


def save_expert_parallel(out, args, model, ep):
    """model's weights as the files of expert-parallel ranks 0..ep-1, each its rank's own model's
    state dict and its megatron-core optimizer's after one step with model's gradients; returns
    that optimizer state by model's names."""
    full = model.state_dict()
    grads = {name: p.grad for name, p in model.named_parameters()}
    args.expert_model_parallel_size, args.data_parallel_size, args.world_size = ep, ep, ep
    expected = {}
    for r in range(ep):
        rank_model = build_model(args, ep_rank=r)
        names = {p: expert_rank_name(n, r, args.num_experts // ep) for n, p in rank_model.named_parameters()}
        optimizer = megatron_optimizer(args, rank_model)
        assert type(optimizer).__name__ == "ChainedOptimizer" and len(optimizer.chained_optimizers) == 2
        for p, name in names.items():
            p.grad = grads[name].clone()
        for o in optimizer.chained_optimizers:
            o.optimizer.step()
        for inner, params in chained_params(optimizer):
            for p in params:
                for kind in ("exp_avg", "exp_avg_sq"):
                    key = kind + "." + names[p]
                    assert key not in expected or torch.equal(expected[key], inner.state[p][kind]), key
                    expected[key] = inner.state[p][kind]
        with torch.no_grad():  # the saved weights are model's
            for p, name in names.items():
                p.copy_(full[name])
        state_dict = {"args": args, "checkpoint_version": 3.0, "iteration": ITERATION,
                      "model": rank_model.state_dict_for_save_checkpoint(), "optimizer": optimizer.state_dict(),
                      "num_floating_point_operations_so_far": 1.5e9}
        folder = os.path.join(out, "iter_%07d" % ITERATION, checkpoint_folder(0, 0, 1, r, ep))
        os.makedirs(folder, exist_ok=True)
        torch.save(state_dict, os.path.join(folder, "model_optim_rng.pt"))
    from megatron.core import parallel_state
    parallel_state.set_expert_model_parallel_world_size(1)  # the EP=1 model's forward follows
    parallel_state.set_expert_model_parallel_rank(0)
    return expected


def save(out, run, ep):
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
    expected_state = {}
    if ep > 1:
        expected_state = save_expert_parallel(out, args, model, ep)
    else:
        folder = os.path.join(out, "iter_%07d" % ITERATION, "mp_rank_00")
        os.makedirs(folder, exist_ok=True)
        torch.save(state_dict, os.path.join(folder, "model_optim_rng.pt"))
    with open(os.path.join(out, "latest_checkpointed_iteration.txt"), "w") as f:
        f.write(str(ITERATION))
    tokens = torch.randint(0, run["vocab_size"] + 1, (BATCH, SEQ))
    logits = forward(model, tokens)
    safetensors_io.write(os.path.join(out, "expected.safetensors"),
                         [("tokens", "I32", tokens.numpy()), ("logits", "F32", logits.numpy())] +
                         [(k, "F32", v.numpy()) for k, v in sorted(expected_state.items())])


def check_namespace(ns, run, ep):
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
                pipeline_model_parallel_size=1, data_parallel_size=ep, use_rope_scaling=False,
                transformer_impl="local", num_experts=run.get("num_experts"), expert_model_parallel_size=ep,
                moe_layer_freq=run.get("moe_layer_freq", 1))
    for k, v in want.items():
        if getattr(ns, k) != v or type(getattr(ns, k)) is not type(v):
            raise SystemExit("args.%s is %r, Megatron holds %r for this run" % (k, getattr(ns, k), v))


def load_expert_parallel(it_dir, args):
    """The EP=1 model of a save at expert parallelism args.expert_model_parallel_size: each file
    loaded strictly into its rank's model, the replicas checked equal."""
    ep = args.expert_model_parallel_size
    full = {}
    for r in range(ep):
        sd = torch.load(os.path.join(it_dir, checkpoint_folder(0, 0, 1, r, ep), "model_optim_rng.pt"),
                        map_location="cpu", weights_only=False)
        rank_model = build_model(args, ep_rank=r)
        rank_model.load_state_dict(sd["model"], strict=True)
        for name, p in rank_model.state_dict().items():
            if p is None or "_extra_state" in name:
                continue
            name = expert_rank_name(name, r, args.num_experts // ep)
            if name in full and not torch.equal(full[name], p):
                raise SystemExit("%s differs between the expert-parallel ranks' files" % name)
            full[name] = p
    one = argparse.Namespace(**vars(args))
    one.expert_model_parallel_size = 1
    model = build_model(one)
    model.load_state_dict(full, strict=False)
    missing = [n for n in model.state_dict() if n not in full and "_extra_state" not in n]
    if missing:
        raise SystemExit("no expert-parallel rank's file holds %s" % missing)
    return model


def check(ckpt, expected, run):
    tracker = open(os.path.join(ckpt, "latest_checkpointed_iteration.txt")).read().strip()
    it_dir = os.path.join(ckpt, "iter_%07d" % int(tracker))
    first = min(n for n in os.listdir(it_dir) if n.startswith("mp_rank_00"))  # rank 0's, any suffix
    path = os.path.join(it_dir, first, "model_optim_rng.pt")
    sd = torch.load(path, map_location="cpu", weights_only=False)
    ep = sd["args"].expert_model_parallel_size
    check_namespace(sd["args"], run, ep)
    if ep > 1:
        model = load_expert_parallel(it_dir, sd["args"])
    else:
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


def tessera_tensors(ckpt, kind):
    """Every tensor of tessera's own save's files `kind`.safetensors (all its shard folders)."""
    tracker = open(os.path.join(ckpt, "latest_checkpointed_iteration.txt")).read().strip()
    it_dir = os.path.join(ckpt, "iter_%07d" % int(tracker))
    out = {}
    for folder in sorted(os.listdir(it_dir)):
        path = os.path.join(it_dir, folder, kind + ".safetensors")
        if os.path.exists(path):
            out.update(safetensors_io.read(path)[0])
    return out


def check_optimizer_groups(rank, saved, fresh, args, iteration):
    """The saved optimizer state dict against megatron-core's own (fresh, no step taken); the
    distributed optimizer's groups have no params and the step (distrib_optimizer.py
    state_dict)."""
    if len(saved["param_groups"]) != len(fresh["param_groups"]):
        raise SystemExit("%s: %d parameter groups saved, megatron-core's optimizer has %d"
                         % (rank, len(saved["param_groups"]), len(fresh["param_groups"])))
    for i, (s, f) in enumerate(zip(saved["param_groups"], fresh["param_groups"])):
        f = dict(f)
        if args.use_distributed_optimizer:
            del f["params"]
            f["step"] = iteration
        if set(s) != set(f):
            raise SystemExit("%s group %d keys %s, megatron-core's %s" % (rank, i, sorted(s), sorted(f)))
        for k in f:
            want = args.weight_decay * s["wd_mult"] if k == "weight_decay" else f[k]
            if k != "lr" and s[k] != want:  # lr: the scheduler's at the save
                raise SystemExit("%s group %d: %s is %r, megatron-core's %r" % (rank, i, k, s[k], want))


def check_optimizer(ckpt, tessera_ckpt):
    tracker = open(os.path.join(ckpt, "latest_checkpointed_iteration.txt")).read().strip()
    it_dir = os.path.join(ckpt, "iter_%07d" % int(tracker))
    state = tessera_tensors(tessera_ckpt, "optimizer")
    main_params = tessera_tensors(tessera_ckpt, "model")
    checked = 0
    args = None
    for r in range(1 << 16):
        path = os.path.join(it_dir, "mp_rank_00_%03d" % r, "model_optim_rng.pt")
        if not os.path.exists(path):
            break
        sd = torch.load(path, map_location="cpu", weights_only=False)
        args = sd["args"]
        ep = args.expert_model_parallel_size
        rank = "%s (EP rank %d of %d)" % (path, r, ep)
        # An fp32 model: Float16OptimizerWithFloat16Params keeps fp32 copies of the 16-bit
        # parameters in its groups, in their order, and its moments in fp32.
        fp32 = argparse.Namespace(**vars(args))
        fp32.bf16, fp32.fp16, fp32.params_dtype = False, False, torch.float32
        model = build_model(fp32, ep_rank=r)
        model.load_state_dict(sd["model"], strict=True)
        optimizer = megatron_optimizer(args, model)
        fresh = optimizer.state_dict()
        saved = sd["optimizer"]
        if not isinstance(saved, list) or len(saved) != len(fresh):
            raise SystemExit("%s: optimizer is %s, megatron-core's ChainedOptimizer saves a list of %d"
                             % (rank, type(saved).__name__, len(fresh)))
        bf16 = args.bf16
        for i, (s, f) in enumerate(zip(saved, fresh)):
            if args.use_distributed_optimizer:
                if set(s) != {"optimizer"} or set(s["optimizer"]) != {"param_groups"}:
                    raise SystemExit("%s optimizer[%d] has keys %s, the distributed optimizer's state_dict {'optimizer':"
                                     " {'param_groups'}}" % (rank, i, sorted(s)))
                check_optimizer_groups("%s optimizer[%d]" % (rank, i), s["optimizer"], f, args, sd["iteration"])
                continue
            if bf16 != ("fp32_from_fp16_params" in s):
                raise SystemExit("%s optimizer[%d] has keys %s (bf16 %s)" % (rank, i, sorted(s), bf16))
            check_optimizer_groups("%s optimizer[%d]" % (rank, i), s["optimizer"] if bf16 else s, f, args,
                                   sd["iteration"])
        if args.use_distributed_optimizer:
            continue  # the moments are in distrib_optim.pt (tests/integration/megatron_checkpoint_test.py)
        names = {p: expert_rank_name(n, r, args.num_experts // ep) for n, p in model.named_parameters()}
        if bf16:
            for s, (_, params) in zip(saved, chained_params(optimizer)):
                masters = [t for group in s["fp32_from_fp16_params"] for t in group]
                assert len(masters) == len(params), (len(masters), len(params))
                for p, m in zip(params, masters):
                    if m.dtype != torch.float32 or m.shape != p.shape or \
                            m.numpy().tobytes() != main_params[names[p]]["raw"]:
                        raise SystemExit("%s: fp32_from_fp16_params of %s differ from tessera's main parameter"
                                         % (rank, names[p]))
            saved = [s["optimizer"] for s in saved]
        optimizer.load_state_dict(saved)  # megatron-core's own loader takes it
        for inner, params in chained_params(optimizer):
            for p in params:
                for kind in ("exp_avg", "exp_avg_sq"):
                    got = inner.state[p][kind]
                    want = state[kind + "." + names[p]]
                    if got.shape != p.shape or got.numpy().tobytes() != want["raw"]:
                        raise SystemExit("%s: megatron-core's %s of %s differs from tessera's" % (rank, kind, names[p]))
                    checked += 1
    if args is None:
        raise SystemExit("%s holds no mp_rank_00_EEE folders" % it_dir)
    print("megatron-core's ChainedOptimizer loads each of %d EP ranks' files; %d state tensors equal tessera's"
          % (args.expert_model_parallel_size, checked))


def main():
    p = argparse.ArgumentParser()
    p.add_argument("action", choices=["save", "check", "check-optimizer"])
    p.add_argument("paths", nargs="+")
    p.add_argument("--model", choices=sorted(RUNS), required=True)
    p.add_argument("--ep", type=int, default=1)
    a = p.parse_args()
    run = RUNS[a.model]
    init_cpu_megatron()
    if a.action == "save":
        save(a.paths[0], run, a.ep)
    elif a.action == "check-optimizer":
        check_optimizer(a.paths[0], a.paths[1])
    else:
        check(a.paths[0], a.paths[1], run)


if __name__ == "__main__":
    main()
