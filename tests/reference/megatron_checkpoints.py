#!/usr/bin/python3
"""Megatron-LM `--ckpt-format torch` checkpoints of a tiny GPT-2, built with PyTorch in the
layout megatron/training/checkpointing.py writes, and the reference forward of the same
weights, for tessera's loader tests.

    /usr/bin/python3 tests/reference/megatron_checkpoints.py --out DIR

writes, each TP=2 x PP=2 at iteration 7 (tracker "7"):
  DIR/mcore/   mcore names, local spec (`_extra_state` None after every linear layer), the
               tied output layer's copy on the last stage, an fp32 torch AdamW state under
               Megatron's two parameter groups, opt_param_scheduler, rerun_state_machine
               (Megatron's enums), rng_state with numpy's state;
  DIR/te/      mcore names with Transformer Engine's fused norms (linear_qkv.layer_norm_weight,
               linear_fc1.layer_norm_bias, ...) and tensor `_extra_state`s, model only;
  DIR/legacy/  the legacy model's nested state dict (language_model.embedding...,
               language_model.encoder.layers.0.input_norm..., query_key_value, dense,
               post_attention_norm, dense_h_to_4h, dense_4h_to_h, final_norm) with
               word_embeddings_for_head on the last stage, model only.
Each stage numbers its layers from 0. The padded vocabulary rows (100 real, 128 padded for
--make-vocab-size-divisible-by 64 x TP 2) are copies of the last real row, as Megatron's
converter pads.
  DIR/expected.safetensors  tokens I32 [2, 16] (inputs), labels I32 [2, 16], logits F32
               [2, 16, 128] and loss F32 [1] (token mean) of tests/reference/gpt_reference.py's
               float64 forward of these weights.
The args Namespace holds ModelType, params_dtype and every field Megatron's loader reads; the
enums come from tests/reference/megatron_stub (Megatron-LM itself is not needed).
"""
import argparse
import os
import sys

import numpy as np
import torch

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, HERE)
sys.path.insert(0, os.path.join(HERE, "megatron_stub"))
import gpt_reference  # noqa: E402
import safetensors_io  # noqa: E402
from megatron.core.enums import ModelType  # noqa: E402
from megatron.core.rerun_state_machine import RerunMode, RerunState  # noqa: E402

TP, PP, ITERATION, CONSUMED = 2, 2, 7, 56
M = dict(gpt_reference.MODEL, make_vocab_size_divisible_by=64)


def column(name):
    return name.endswith(("word_embeddings.weight", "output_layer.weight", "linear_qkv.weight", "linear_qkv.bias",
                          "linear_fc1.weight", "linear_fc1.bias"))


def row(name):
    return name.endswith(("linear_proj.weight", "linear_fc2.weight"))


def tp_slice(name, t, r):
    if column(name):
        return t.chunk(TP, dim=0)[r].clone()
    if row(name):
        return t.chunk(TP, dim=1)[r].clone()
    return t.clone()


def args_namespace():
    return argparse.Namespace(
        num_layers=M["num_layers"], hidden_size=M["hidden_size"], num_attention_heads=M["num_attention_heads"],
        kv_channels=M["kv_channels"], ffn_hidden_size=M["ffn_hidden_size"], num_query_groups=M["num_attention_heads"],
        seq_length=M["seq_length"], max_position_embeddings=M["max_position_embeddings"],
        make_vocab_size_divisible_by=M["make_vocab_size_divisible_by"], padded_vocab_size=M["padded_vocab_size"],
        tokenizer_type="NullTokenizer", vocab_size=M["vocab_size"] - 1, norm_epsilon=M["norm_epsilon"],
        normalization="LayerNorm", position_embedding_type="learned_absolute", add_position_embedding=True,
        untie_embeddings_and_output_weights=False, add_bias_linear=True, bias_gelu_fusion=True, openai_gelu=False,
        hidden_dropout=0.0, attention_dropout=0.0, init_method_std=0.02, fp16=False, bf16=False,
        params_dtype=torch.float32, model_type=ModelType.encoder_or_decoder, tensor_model_parallel_size=TP,
        pipeline_model_parallel_size=PP, data_parallel_size=1, world_size=TP * PP, micro_batch_size=2,
        global_batch_size=8, train_iters=20, consumed_train_samples=CONSUMED, consumed_valid_samples=0,
        skipped_train_samples=0, transformer_impl="local", ckpt_format="torch", use_distributed_optimizer=False,
        lr=1e-3, min_lr=1e-4, rerun_mode="disabled")


def scheduler():
    return {"max_lr": 1e-3, "lr_warmup_steps": 16, "num_steps": CONSUMED, "lr_decay_style": "cosine",
            "lr_decay_steps": 160, "min_lr": 1e-4, "start_wd": 0.1, "end_wd": 0.1, "wd_incr_style": "constant",
            "wd_incr_steps": 160}


def stage_params(w, pp, r):
    """(mcore name with local layer numbers, tensor) of rank (r, pp), registration order."""
    per = M["num_layers"] // PP
    out = []
    if pp == 0:
        out += [(n, w[n]) for n in ("embedding.word_embeddings.weight", "embedding.position_embeddings.weight")]
    for local in range(per):
        g = "decoder.layers.%d." % (pp * per + local)
        for n in w:
            if n.startswith(g):
                out.append(("decoder.layers.%d.%s" % (local, n[len(g):]), w[n]))
    if pp == PP - 1:
        out += [(n, w[n]) for n in ("decoder.final_layernorm.weight", "decoder.final_layernorm.bias")]
        out.append(("output_layer.weight", w["embedding.word_embeddings.weight"]))  # the tied copy (PP > 1)
    return [(n, tp_slice(n, t, r)) for n, t in out]


def with_extra_states(params, extra):
    d = {}
    for i, (n, t) in enumerate(params):
        d[n] = t
        module = n.rsplit(".", 1)[0]
        nxt = params[i + 1][0].rsplit(".", 1)[0] if i + 1 < len(params) else None
        if module.endswith(("linear_qkv", "linear_proj", "linear_fc1", "linear_fc2", "output_layer")) and nxt != module:
            d[module + "._extra_state"] = extra()
    return d


def optimizer_state(params, rng):
    """torch AdamW's state_dict over Megatron's groups (weight decay first on stage 0, no decay
    first on later stages: groups in order of first appearance)."""
    keys, groups = [], {}
    for n, t in params:
        wd = not (n.endswith(".bias") or t.dim() == 1)
        if wd not in groups:
            keys.append(wd)
            groups[wd] = []
        groups[wd].append((n, t))
    state, param_groups, index = {}, [], 0
    for wd in keys:
        ids = []
        for n, t in groups[wd]:
            state[index] = {"step": torch.tensor(float(ITERATION)),
                            "exp_avg": torch.tensor(rng.standard_normal(tuple(t.shape)), dtype=torch.float32),
                            "exp_avg_sq": torch.tensor(rng.random_sample(tuple(t.shape)), dtype=torch.float32)}
            ids.append(index)
            index += 1
        param_groups.append({"lr": 1e-3, "betas": (0.9, 0.999), "eps": 1e-8, "weight_decay": 0.1 if wd else 0.0,
                             "amsgrad": False, "foreach": None, "maximize": False, "capturable": False,
                             "differentiable": False, "fused": None, "wd_mult": 1.0 if wd else 0.0, "lr_mult": 1.0,
                             "is_expert_parallel": False, "is_decoupled_lr": False, "params": ids})
    return {"state": state, "param_groups": param_groups}


TE_NORMS = {"input_layernorm.weight": "self_attention.linear_qkv.layer_norm_weight",
            "input_layernorm.bias": "self_attention.linear_qkv.layer_norm_bias",
            "pre_mlp_layernorm.weight": "mlp.linear_fc1.layer_norm_weight",
            "pre_mlp_layernorm.bias": "mlp.linear_fc1.layer_norm_bias"}
LEGACY_LAYER = {"input_layernorm.": "input_norm.", "self_attention.linear_qkv.": "self_attention.query_key_value.",
                "self_attention.linear_proj.": "self_attention.dense.", "pre_mlp_layernorm.": "post_attention_norm.",
                "mlp.linear_fc1.": "mlp.dense_h_to_4h.", "mlp.linear_fc2.": "mlp.dense_4h_to_h."}


def te_names(params):
    out = []
    for n, t in params:
        for a, b in TE_NORMS.items():
            if n.startswith("decoder.layers.") and n.endswith(a):
                n = n[:-len(a)] + b
        out.append((n, t))
    # TE registers each norm inside the linear layer it is fused into, before its weight.
    order = {n: i for i, (n, _) in enumerate(out)}

    def key(item):
        n = item[0]
        for fused, owner in (("self_attention.linear_qkv.layer_norm", "self_attention.linear_qkv.weight"),
                             ("mlp.linear_fc1.layer_norm", "mlp.linear_fc1.weight")):
            if fused in n:
                return order[n.split(fused)[0] + owner] - 0.5
        return order[n]
    return sorted(out, key=key)


def legacy_model(params, last):
    embedding, encoder, head = {}, {}, {}
    for n, t in params:
        if n.startswith("embedding."):
            part = n.split(".")[1]
            embedding.setdefault(part, {})["weight"] = t
        elif n.startswith("decoder.layers."):
            rest = n[len("decoder."):]
            layer, tail = rest.split(".", 2)[1], rest.split(".", 2)[2]
            for a, b in LEGACY_LAYER.items():
                if tail.startswith(a):
                    tail = b + tail[len(a):]
            encoder["layers.%s.%s" % (layer, tail)] = t
        elif n.startswith("decoder.final_layernorm."):
            encoder["final_norm." + n.rsplit(".", 1)[1]] = t
        elif n == "output_layer.weight":
            head["weight"] = t
    model = {"language_model": {}}
    if embedding:
        model["language_model"]["embedding"] = embedding
    model["language_model"]["encoder"] = encoder
    if last:
        model["word_embeddings_for_head"] = head
    return model


def save(out, kind, w, rng):
    folder = os.path.join(out, kind)
    for pp in range(PP):
        for r in range(TP):
            params = stage_params(w, pp, r)
            if kind == "mcore":
                model = with_extra_states(params, lambda: None)
            elif kind == "te":
                model = with_extra_states(te_names(params), lambda: torch.empty(0, dtype=torch.uint8))
            else:
                model = legacy_model(params, pp == PP - 1)
            sd = {"args": args_namespace(), "checkpoint_version": 3.0, "iteration": ITERATION, "model": model}
            if kind == "mcore":
                sd["optimizer"] = optimizer_state(params, rng)
                sd["opt_param_scheduler"] = scheduler()
                sd["rerun_state_machine"] = {"mode": RerunMode.DISABLED, "state": RerunState.NOT_RUNNING_YET,
                                             "current_iteration": ITERATION, "rerun_requested": False,
                                             "checkpoint_requested": False}
                sd["rng_state"] = [{"random_rng_state": (3, tuple(range(625)), None),
                                    "np_rng_state": np.random.RandomState(1234).get_state(),
                                    "torch_rng_state": torch.get_rng_state(),
                                    "cuda_rng_state": torch.zeros(16, dtype=torch.uint8),
                                    "rng_tracker_states": {"model-parallel-rng": torch.zeros(16, dtype=torch.uint8)}}]
            sd["num_floating_point_operations_so_far"] = 0.0
            shard = "mp_rank_%02d_%03d" % (r, pp)
            os.makedirs(os.path.join(folder, "iter_%07d" % ITERATION, shard), exist_ok=True)
            torch.save(sd, os.path.join(folder, "iter_%07d" % ITERATION, shard, "model_optim_rng.pt"))
    with open(os.path.join(folder, "latest_checkpointed_iteration.txt"), "w") as f:
        f.write(str(ITERATION))


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--out", required=True)
    out = ap.parse_args().out
    rng = np.random.RandomState(4321)
    w = {n: torch.tensor(v) for n, v in gpt_reference.init_weights(M, rng).items()}
    V = M["vocab_size"]
    emb = w["embedding.word_embeddings.weight"]
    emb[V:] = emb[V - 1]  # Megatron's converter pads by copying the last row
    for kind in ("mcore", "te", "legacy"):
        save(out, kind, w, rng)

    B, T = 2, M["seq_length"]
    tokens = rng.randint(0, V, size=(B, T + 1)).astype(np.int32)
    tok = torch.tensor(tokens, dtype=torch.long)
    p = {n: t.double() for n, t in w.items()}
    logits = gpt_reference.megatron_forward(p, M, tok[:, :-1])
    loss = gpt_reference.token_mean_loss(logits, tok[:, 1:])
    safetensors_io.write(os.path.join(out, "expected.safetensors"), [
        ("tokens", "I32", np.ascontiguousarray(tokens[:, :-1])), ("labels", "I32", np.ascontiguousarray(tokens[:, 1:])),
        ("logits", "F32", logits.numpy().astype(np.float32)), ("loss", "F32", np.array([loss.item()], np.float32))])


if __name__ == "__main__":
    main()
