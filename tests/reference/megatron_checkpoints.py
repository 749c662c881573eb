#!/usr/bin/python3
"""Megatron-LM `--ckpt-format torch` checkpoints of a tiny GPT-2 and a tiny Llama, built with
PyTorch in the layout megatron/training/checkpointing.py writes, and the reference forward of
the same weights, for tessera's loader tests.

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
--make-vocab-size-divisible-by 64 x TP 2; the Llama's output layer's too) are copies of the
last real row, as Megatron's converter pads.
  DIR/expected.safetensors  tokens I32 [2, 16] (inputs), labels I32 [2, 16], logits F32
               [2, 16, 128] and loss F32 [1] (token mean) of tests/reference/gpt_reference.py's
               float64 forward of these weights.
and of a tiny Llama (LLAMA: llama_reference.py's model with 8 heads in 4 query groups; RMSNorm,
RoPE, SwiGLU, no biases, untied output layer), model only, its args as a Llama run saves them
(swiglu, normalization, position_embedding_type, group_query_attention, num_query_groups,
rotary_base, ...), each rank's linear_fc1 Megatron's [gate_r; up_r] [2F/TP, H] and its
linear_qkv its query groups' rows:
  DIR/llama_mcore/    mcore names, local spec;
  DIR/llama_te/       Transformer Engine's fused norm names;
  DIR/llama_release/  mcore names in the release form Megatron's converter writes (tracker
                      "release", folder release/, nothing consumed);
  DIR/expected_llama.safetensors  the same four tensors from llama_reference.py's float64
               Megatron-layout forward (checked there against transformers' LlamaForCausalLM).
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
import llama_reference  # noqa: E402
import safetensors_io  # noqa: E402
from megatron.core.enums import ModelType  # noqa: E402
from megatron.core.rerun_state_machine import RerunMode, RerunState  # noqa: E402

TP, PP, ITERATION, CONSUMED = 2, 2, 7, 56
M = dict(gpt_reference.MODEL, make_vocab_size_divisible_by=64)
# llama_reference.py's model with 8 heads in 4 query groups, so that TP 4 (one group a rank)
# can load it as well as TP 1.
LLAMA = dict(llama_reference.MODEL, num_attention_heads=8, num_query_groups=4, kv_channels=8)


def column(name):
    return name.endswith(("word_embeddings.weight", "output_layer.weight", "linear_qkv.weight", "linear_qkv.bias",
                          "linear_fc1.weight", "linear_fc1.bias"))


def row(name):
    return name.endswith(("linear_proj.weight", "linear_fc2.weight"))


def tp_slice(name, t, r):
    if t.dim() == 3:  # SwiGLU's fc1 [2, F, H]: Megatron's rank r holds [gate_r; up_r] (mlp.py)
        return torch.cat([half.chunk(TP, dim=0)[r] for half in t]).clone()
    if column(name):
        return t.chunk(TP, dim=0)[r].clone()
    if row(name):
        return t.chunk(TP, dim=1)[r].clone()
    return t.clone()


def args_namespace(m=M, llama=False, consumed=CONSUMED):
    a = argparse.Namespace(
        num_layers=m["num_layers"], hidden_size=m["hidden_size"], num_attention_heads=m["num_attention_heads"],
        kv_channels=m["kv_channels"], ffn_hidden_size=m["ffn_hidden_size"], num_query_groups=m["num_attention_heads"],
        seq_length=m["seq_length"], max_position_embeddings=m["max_position_embeddings"],
        make_vocab_size_divisible_by=m["make_vocab_size_divisible_by"], padded_vocab_size=m["padded_vocab_size"],
        tokenizer_type="NullTokenizer", vocab_size=m["vocab_size"] - 1, norm_epsilon=m["norm_epsilon"],
        normalization="LayerNorm", position_embedding_type="learned_absolute", add_position_embedding=True,
        untie_embeddings_and_output_weights=False, add_bias_linear=True, bias_gelu_fusion=True, openai_gelu=False,
        hidden_dropout=0.0, attention_dropout=0.0, init_method_std=0.02, fp16=False, bf16=False,
        params_dtype=torch.float32, model_type=ModelType.encoder_or_decoder, tensor_model_parallel_size=TP,
        pipeline_model_parallel_size=PP, data_parallel_size=1, world_size=TP * PP, micro_batch_size=2,
        global_batch_size=8, train_iters=20, consumed_train_samples=consumed, consumed_valid_samples=0,
        skipped_train_samples=0, transformer_impl="local", ckpt_format="torch", use_distributed_optimizer=False,
        lr=1e-3, min_lr=1e-4, rerun_mode="disabled", swiglu=False, group_query_attention=False,
        rotary_base=10000, rotary_percent=1.0, apply_layernorm_1p=False)
    if llama:  # the args a Llama run (--swiglu --group-query-attention ...) saves
        a.__dict__.update(
            num_query_groups=m["num_query_groups"], group_query_attention=True, swiglu=True, normalization="RMSNorm",
            position_embedding_type="rope", add_position_embedding=False, rotary_base=m["rotary_base"],
            untie_embeddings_and_output_weights=True, add_bias_linear=False, bias_gelu_fusion=False,
            bias_swiglu_fusion=True)
    return a


def scheduler():
    return {"max_lr": 1e-3, "lr_warmup_steps": 16, "num_steps": CONSUMED, "lr_decay_style": "cosine",
            "lr_decay_steps": 160, "min_lr": 1e-4, "start_wd": 0.1, "end_wd": 0.1, "wd_incr_style": "constant",
            "wd_incr_steps": 160}


def stage_params(w, m, pp, r):
    """(mcore name with local layer numbers, tensor) of rank (r, pp), registration order."""
    per = m["num_layers"] // PP
    out = []
    if pp == 0:
        out += [(n, w[n]) for n in ("embedding.word_embeddings.weight", "embedding.position_embeddings.weight")
                if n in w]
    for local in range(per):
        g = "decoder.layers.%d." % (pp * per + local)
        for n in w:
            if n.startswith(g):
                out.append(("decoder.layers.%d.%s" % (local, n[len(g):]), w[n]))
    if pp == PP - 1:
        out += [(n, w[n]) for n in ("decoder.final_layernorm.weight", "decoder.final_layernorm.bias") if n in w]
        # untied, or the tied copy (PP > 1)
        out.append(("output_layer.weight", w.get("output_layer.weight", w["embedding.word_embeddings.weight"])))
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


def save(out, folder_name, names, w, rng, m=M, llama=False, release=False):
    """One TP x PP checkpoint in DIR/folder_name with `names` (mcore, te or legacy); GPT's mcore
    one with the optimizer, scheduler, rerun and RNG state; `release` as Megatron's converter
    writes it (tracker "release", folder release/, no optimizer or RNG, nothing consumed)."""
    folder = os.path.join(out, folder_name)
    it_folder = "release" if release else "iter_%07d" % ITERATION
    for pp in range(PP):
        for r in range(TP):
            params = stage_params(w, m, pp, r)
            if names == "mcore":
                model = with_extra_states(params, lambda: None)
            elif names == "te":
                model = with_extra_states(te_names(params), lambda: torch.empty(0, dtype=torch.uint8))
            else:
                model = legacy_model(params, pp == PP - 1)
            sd = {"args": args_namespace(m, llama, 0 if release else CONSUMED), "checkpoint_version": 3.0,
                  "iteration": ITERATION, "model": model}
            if names == "mcore" and not llama:
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
            os.makedirs(os.path.join(folder, it_folder, shard), exist_ok=True)
            torch.save(sd, os.path.join(folder, it_folder, shard, "model_optim_rng.pt"))
    with open(os.path.join(folder, "latest_checkpointed_iteration.txt"), "w") as f:
        f.write("release" if release else str(ITERATION))


def pad_vocab(t, vp):
    """[V, H] -> [vp, H], the padding rows copies of the last real row (Megatron's converter)."""
    return torch.cat([t, t[-1:].expand(vp - t.shape[0], -1)])


def llama_weights(m, rng):
    """Random float32 weights of a Hugging Face LlamaForCausalLM (std 0.02, norms 1 + noise),
    mapped by llama_reference.megatron_layout (grouped QKV rows, fc1 [2, F, H]); both
    vocabulary matrices padded as Megatron's converter pads."""
    H, F, V, hd = m["hidden_size"], m["ffn_hidden_size"], m["vocab_size"], m["kv_channels"]
    NH, NG = m["num_attention_heads"], m["num_query_groups"]

    def normal(*shape):
        return torch.tensor(0.02 * rng.standard_normal(shape), dtype=torch.float32)

    def norm():
        return torch.tensor(1.0 + 0.1 * rng.standard_normal(H), dtype=torch.float32)

    hf = {"model.embed_tokens.weight": normal(V, H), "model.norm.weight": norm(), "lm_head.weight": normal(V, H)}
    for i in range(m["num_layers"]):
        h = "model.layers.%d." % i
        hf.update({h + "input_layernorm.weight": norm(), h + "post_attention_layernorm.weight": norm(),
                   h + "self_attn.q_proj.weight": normal(NH * hd, H), h + "self_attn.k_proj.weight": normal(NG * hd, H),
                   h + "self_attn.v_proj.weight": normal(NG * hd, H), h + "self_attn.o_proj.weight": normal(H, NH * hd),
                   h + "mlp.gate_proj.weight": normal(F, H), h + "mlp.up_proj.weight": normal(F, H),
                   h + "mlp.down_proj.weight": normal(H, F)})
    w = llama_reference.megatron_layout(hf, m)
    vp = m["padded_vocab_size"]
    w["embedding.word_embeddings.weight"] = pad_vocab(hf["model.embed_tokens.weight"], vp)
    w["output_layer.weight"] = pad_vocab(hf["lm_head.weight"], vp)
    return w


def write_expected(path, logits, loss, tokens):
    safetensors_io.write(path, [
        ("tokens", "I32", np.ascontiguousarray(tokens[:, :-1])), ("labels", "I32", np.ascontiguousarray(tokens[:, 1:])),
        ("logits", "F32", logits.detach().numpy().astype(np.float32)),
        ("loss", "F32", np.array([loss.item()], np.float32))])


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--out", required=True)
    out = ap.parse_args().out
    rng = np.random.RandomState(4321)
    w = {n: torch.tensor(v) for n, v in gpt_reference.init_weights(M, rng).items()}
    V = M["vocab_size"]
    emb = w["embedding.word_embeddings.weight"]
    emb[V:] = emb[V - 1]  # Megatron's converter pads by copying the last row
    for names in ("mcore", "te", "legacy"):
        save(out, names, names, w, rng)

    B, T = 2, M["seq_length"]
    tokens = rng.randint(0, V, size=(B, T + 1)).astype(np.int32)
    tok = torch.tensor(tokens, dtype=torch.long)
    p = {n: t.double() for n, t in w.items()}
    logits = gpt_reference.megatron_forward(p, M, tok[:, :-1])
    write_expected(os.path.join(out, "expected.safetensors"), logits,
                   gpt_reference.token_mean_loss(logits, tok[:, 1:]), tokens)

    L = LLAMA
    w = llama_weights(L, rng)
    save(out, "llama_mcore", "mcore", w, rng, L, llama=True)
    save(out, "llama_te", "te", w, rng, L, llama=True)
    save(out, "llama_release", "mcore", w, rng, L, llama=True, release=True)
    tokens = rng.randint(0, L["vocab_size"], size=(B, L["seq_length"] + 1)).astype(np.int32)
    tok = torch.tensor(tokens, dtype=torch.long)
    logits = llama_reference.megatron_forward({n: t.double() for n, t in w.items()}, L, tok[:, :-1])
    write_expected(os.path.join(out, "expected_llama.safetensors"), logits,
                   llama_reference.token_mean_loss(logits, tok[:, 1:]), tokens)


if __name__ == "__main__":
    main()
