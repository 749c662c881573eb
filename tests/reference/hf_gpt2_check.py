#!/usr/bin/python3
"""Checks a Hugging Face GPT-2 folder written by `tessera ckpt export-hf`, independently of
tessera: the folder is read with safetensors_io and run by a plain-torch forward with
GPT2LMHeadModel's semantics (transformers' modeling_gpt2: Conv1D x @ W + b, c_attn split into
[Q; K; V], causal mask, softmax(QK^T / sqrt(head dim)), GELU per activation_function, n_inner,
tied or separate lm_head), in float64.

    hf_gpt2_check.py logits HF_DIR EXPECTED.safetensors [--rtol 1e-5]
        EXPECTED holds tokens I32 [B, T] and logits F32 [B, T, >= vocab_size] (tessera's
        forward of the checkpoint); the HF forward's logits must match the first vocab_size
        columns: max |diff| <= rtol * max |logits|.
    hf_gpt2_check.py same HF_DIR REF_DIR
        every tensor of REF_DIR/model.safetensors (except GPT2Attention's attn.bias /
        attn.masked_bias buffers) is in HF_DIR with the same dtype, shape and bytes, there is
        nothing else, and the model fields of config.json agree.
Exit status 0 when the check holds, 1 when not.
"""
import json
import math
import os
import re
import sys

import numpy as np
import torch

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import hf_check_common  # noqa: E402
import safetensors_io  # noqa: E402

BUFFER = re.compile(r"^(transformer\.)?h\.\d+\.attn\.(bias|masked_bias)$")


def load(hf_dir):
    with open(os.path.join(hf_dir, "config.json")) as f:
        cfg = json.load(f)
    tensors, _, _ = safetensors_io.read(os.path.join(hf_dir, "model.safetensors"), strict=False)
    return cfg, tensors


def gelu(x, kind):
    if kind in ("gelu_new", "gelu_pytorch_tanh", "gelu_fast"):
        return 0.5 * x * (1.0 + torch.tanh(math.sqrt(2.0 / math.pi) * (x + 0.044715 * x ** 3)))
    if kind == "gelu":
        return 0.5 * x * (1.0 + torch.erf(x / math.sqrt(2.0)))
    raise SystemExit("unsupported activation_function %r" % kind)


def hf_forward(cfg, tensors, tokens):
    """GPT2LMHeadModel.forward(tokens).logits in float64; tokens [B, T]."""
    def g(name):
        key = name if name in tensors or name == "lm_head.weight" else "transformer." + name
        return torch.tensor(safetensors_io.array(tensors[key]).astype(np.float64))

    B, T = tokens.shape
    H, nh, L = cfg["n_embd"], cfg["n_head"], cfg["n_layer"]
    hd = H // nh
    eps = cfg.get("layer_norm_epsilon", 1e-5)
    inner = cfg.get("n_inner") or 4 * H
    act = cfg.get("activation_function", "gelu_new")
    wte = g("wte.weight")
    assert wte.shape[0] == cfg["vocab_size"], (wte.shape, cfg["vocab_size"])
    x = wte[tokens] + g("wpe.weight")[torch.arange(T)][None]
    causal = torch.tril(torch.ones(T, T, dtype=torch.bool))
    heads = lambda z: z.view(B, T, nh, hd).transpose(1, 2)  # noqa: E731
    for i in range(L):
        h = "h.%d." % i
        a = torch.nn.functional.layer_norm(x, (H,), g(h + "ln_1.weight"), g(h + "ln_1.bias"), eps)
        q, k, v = (a @ g(h + "attn.c_attn.weight") + g(h + "attn.c_attn.bias")).split(H, dim=2)
        w = heads(q) @ heads(k).transpose(-1, -2) / math.sqrt(hd)
        w = torch.where(causal, w, torch.tensor(torch.finfo(w.dtype).min, dtype=w.dtype))
        y = (torch.softmax(w, dim=-1) @ heads(v)).transpose(1, 2).reshape(B, T, H)
        x = x + y @ g(h + "attn.c_proj.weight") + g(h + "attn.c_proj.bias")
        a = torch.nn.functional.layer_norm(x, (H,), g(h + "ln_2.weight"), g(h + "ln_2.bias"), eps)
        fc = a @ g(h + "mlp.c_fc.weight") + g(h + "mlp.c_fc.bias")
        assert fc.shape[-1] == inner, (fc.shape, inner)
        x = x + gelu(fc, act) @ g(h + "mlp.c_proj.weight") + g(h + "mlp.c_proj.bias")
    x = torch.nn.functional.layer_norm(x, (H,), g("ln_f.weight"), g("ln_f.bias"), eps)
    tied = cfg.get("tie_word_embeddings", True)
    if tied:
        assert "lm_head.weight" not in tensors or np.array_equal(
            safetensors_io.array(tensors["lm_head.weight"]), safetensors_io.array(tensors["transformer.wte.weight"]))
        head = wte
    else:
        assert "lm_head.weight" in tensors, "tie_word_embeddings is false but there is no lm_head.weight"
        head = g("lm_head.weight")
    return x @ head.T


def check_logits(hf_dir, expected, rtol):
    cfg, tensors = load(hf_dir)
    assert cfg.get("model_type") == "gpt2" and cfg.get("architectures") == ["GPT2LMHeadModel"], cfg
    tokens, want = hf_check_common.expected_logits(expected, cfg["vocab_size"])
    with torch.no_grad():
        got = hf_forward(cfg, tensors, tokens)
    return hf_check_common.logits_agree("hf_gpt2_check:", got, want, rtol)


def check_same(hf_dir, ref_dir):
    cfg, tensors = load(hf_dir)
    ref_cfg, ref = load(ref_dir)
    fields = ("vocab_size", "n_positions", "n_embd", "n_layer", "n_head", "n_inner", "activation_function",
              "layer_norm_epsilon", "tie_word_embeddings", "model_type", "architectures")
    ref = {n: t for n, t in ref.items() if not BUFFER.match(n)}
    return hf_check_common.folders_agree("hf_gpt2_check", cfg, ref_cfg, fields, tensors, ref)


if __name__ == "__main__":
    sys.exit(hf_check_common.main(sys.argv, __doc__, check_logits, check_same))
