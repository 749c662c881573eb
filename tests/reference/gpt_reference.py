#!/usr/bin/python3
"""PyTorch reference for tessera's GPT: Megatron-LM's `pretrain_gpt` with
--transformer-impl local semantics, written independently in plain torch ops.

Model: learned absolute positions; pre-LN blocks (x + attn(LN(x)), x + mlp(LN(x))); fused QKV
whose rows are per head [q_h; k_h; v_h] (megatron/core/transformer/attention.py); attention scaled by 1/sqrt(hd)
with the causal mask filled with -10000.0; MLP 4h with the tanh GELU of Megatron's bias-GELU
fusion (constant 0.79788456); final LN; output layer tied to the word embedding;
cross-entropy over the full padded vocabulary; dropout 0.

Everything is computed in float64 from float32 initial weights (the values stored in the HF
file), and written as float32: the reference is the exact answer tessera's float32 must
approach.

    /usr/bin/python3 tests/reference/gpt_reference.py --out DIR [--seed S]

writes
  DIR/hf/config.json, DIR/hf/model.safetensors   GPT-2 in Hugging Face layout (transformer.
      prefix, Conv1D [in, out] weights, c_attn columns [Q; K; V], dummy attn.bias /
      attn.masked_bias buffers, vocab 100 rows, no lm_head.weight since tied), float32.
  DIR/expected_forward.safetensors
      tokens I32 [2, 17]; logits F32 [2, 16, 128]; loss F32 [1];
      grad.<megatron name> F32 (Megatron shapes; the tied word embedding's gradient holds
      both the lookup and the output-layer contributions);
      megatron.<megatron name> F32: the initial weights in Megatron layout (padded rows 0).
  DIR/expected_train.safetensors
      tokens I32 [10, 4, 17] (iteration, sample, token; micro-batch m of an iteration is
      samples [2m, 2m+2)); lm_loss F32 [10] (mean of the micro-batch token-mean losses, before
      the update); grad_norm F32 [10] (pre-clip global L2 norm); lr F32 [10] (the LR of that
      iteration's update).
  DIR/expected_train_final.safetensors
      <megatron name> F32: the weights after the 10th update (optional, sharper check).
  DIR/train_config.json  every hyper-parameter used.

Inputs of a sample are tokens[:-1], labels tokens[1:], positions 0..T-1; the loss is the
mean over all B*T tokens.
"""
import argparse
import json
import math
import os
import sys
import time

import numpy as np
import torch

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import megatron_training  # noqa: E402
import safetensors_io  # noqa: E402
from megatron_training import token_mean_loss  # noqa: E402,F401  (megatron_checkpoints.py uses it)

MODEL = {
    "num_layers": 2,
    "hidden_size": 64,
    "num_attention_heads": 4,
    "kv_channels": 16,
    "ffn_hidden_size": 256,
    "seq_length": 16,
    "max_position_embeddings": 16,
    "vocab_size": 100,
    "make_vocab_size_divisible_by": 128,
    "padded_vocab_size": 128,
    "norm_epsilon": 1e-5,
    "init_method_std": 0.02,
    "gelu": "tanh",
    "untie_embeddings_and_output_weights": False,
    "hidden_dropout": 0.0,
    "attention_dropout": 0.0,
}

TRAIN = megatron_training.TRAIN

FORWARD_BATCH = 2
GELU_TANH_C = 0.79788456  # Megatron's bias_gelu constant (sqrt(2/pi) rounded)


def param_names(m):
    """Megatron state-dict names (megatron/core/models/gpt/gpt_model.py) in registration order, with shapes."""
    H, F, A = m["hidden_size"], m["ffn_hidden_size"], m["num_attention_heads"] * m["kv_channels"]
    Vp, P = m["padded_vocab_size"], m["max_position_embeddings"]
    out = [("embedding.word_embeddings.weight", (Vp, H)),
           ("embedding.position_embeddings.weight", (P, H))]
    for i in range(m["num_layers"]):
        p = "decoder.layers.%d." % i
        out += [(p + "input_layernorm.weight", (H,)), (p + "input_layernorm.bias", (H,)),
                (p + "self_attention.linear_proj.weight", (H, A)),
                (p + "self_attention.linear_proj.bias", (H,)),
                (p + "self_attention.linear_qkv.weight", (3 * A, H)),
                (p + "self_attention.linear_qkv.bias", (3 * A,)),
                (p + "pre_mlp_layernorm.weight", (H,)), (p + "pre_mlp_layernorm.bias", (H,)),
                (p + "mlp.linear_fc1.weight", (F, H)), (p + "mlp.linear_fc1.bias", (F,)),
                (p + "mlp.linear_fc2.weight", (H, F)), (p + "mlp.linear_fc2.bias", (H,))]
    out += [("decoder.final_layernorm.weight", (H,)), ("decoder.final_layernorm.bias", (H,))]
    return out


def init_weights(m, rng):
    """float32 numpy weights in Megatron layout. Std 0.02 (output projections scaled by
    1/sqrt(2L)); LN weights 1 + noise and all biases random so every term of the gradient is
    exercised; the padded vocab rows are zero, as --init-from-hf leaves them."""
    std = m["init_method_std"]
    scaled = std / math.sqrt(2.0 * m["num_layers"])
    w = {}
    for name, shape in param_names(m):
        if name.endswith("layernorm.weight"):
            a = 1.0 + 0.1 * rng.standard_normal(shape)
        elif name.endswith("layernorm.bias"):
            a = 0.1 * rng.standard_normal(shape)
        elif name.endswith(".bias"):
            a = 0.02 * rng.standard_normal(shape)
        elif "linear_proj" in name or "linear_fc2" in name:
            a = scaled * rng.standard_normal(shape)
        else:
            a = std * rng.standard_normal(shape)
        if name == "embedding.word_embeddings.weight":
            a[m["vocab_size"]:] = 0.0
        w[name] = a.astype(np.float32)
    return w


# ---------------------------------------------------------------------------------------------
# Megatron-layout model


def layer_norm(x, w, b, eps):
    mu = x.mean(dim=-1, keepdim=True)
    var = ((x - mu) ** 2).mean(dim=-1, keepdim=True)
    return (x - mu) / torch.sqrt(var + eps) * w + b


def gelu_tanh(x):
    return 0.5 * x * (1.0 + torch.tanh(GELU_TANH_C * x * (1.0 + 0.044715 * x * x)))


def megatron_forward(p, m, tokens):
    """tokens [B, T] -> logits [B, T, Vp]."""
    B, T = tokens.shape
    H, nh, hd = m["hidden_size"], m["num_attention_heads"], m["kv_channels"]
    eps = m["norm_epsilon"]
    x = p["embedding.word_embeddings.weight"][tokens] + \
        p["embedding.position_embeddings.weight"][torch.arange(T)][None]
    future = torch.triu(torch.ones(T, T, dtype=torch.bool), diagonal=1)
    for i in range(m["num_layers"]):
        q_ = "decoder.layers.%d." % i
        a = layer_norm(x, p[q_ + "input_layernorm.weight"], p[q_ + "input_layernorm.bias"], eps)
        qkv = a @ p[q_ + "self_attention.linear_qkv.weight"].T + p[q_ + "self_attention.linear_qkv.bias"]
        qkv = qkv.view(B, T, nh, 3 * hd).permute(0, 2, 1, 3)  # [B, nh, T, 3hd]: per head [q; k; v]
        q, k, v = qkv[..., :hd], qkv[..., hd:2 * hd], qkv[..., 2 * hd:]
        scores = (q @ k.transpose(-1, -2)) / math.sqrt(hd)
        scores = scores.masked_fill(future, -10000.0)
        probs = torch.softmax(scores, dim=-1)
        ctx = (probs @ v).permute(0, 2, 1, 3).reshape(B, T, nh * hd)
        x = x + ctx @ p[q_ + "self_attention.linear_proj.weight"].T + p[q_ + "self_attention.linear_proj.bias"]
        a = layer_norm(x, p[q_ + "pre_mlp_layernorm.weight"], p[q_ + "pre_mlp_layernorm.bias"], eps)
        h = gelu_tanh(a @ p[q_ + "mlp.linear_fc1.weight"].T + p[q_ + "mlp.linear_fc1.bias"])
        x = x + h @ p[q_ + "mlp.linear_fc2.weight"].T + p[q_ + "mlp.linear_fc2.bias"]
    x = layer_norm(x, p["decoder.final_layernorm.weight"], p["decoder.final_layernorm.bias"], eps)
    return x @ p["embedding.word_embeddings.weight"].T


def torch_params(w):
    return {k: torch.tensor(v, dtype=torch.float64, requires_grad=True) for k, v in w.items()}


# ---------------------------------------------------------------------------------------------
# Hugging Face GPT-2 layout


def to_hf(w, m):
    """Megatron-layout float32 weights -> GPT2LMHeadModel tensors (list of (name, array))."""
    H, nh, hd, V, T = m["hidden_size"], m["num_attention_heads"], m["kv_channels"], \
        m["vocab_size"], m["max_position_embeddings"]
    out = [("transformer.wte.weight", w["embedding.word_embeddings.weight"][:V]),
           ("transformer.wpe.weight", w["embedding.position_embeddings.weight"])]
    for i in range(m["num_layers"]):
        mp, hp = "decoder.layers.%d." % i, "transformer.h.%d." % i
        qkv_w = w[mp + "self_attention.linear_qkv.weight"]          # [nh*3hd, H], per head [q;k;v]
        qkv_b = w[mp + "self_attention.linear_qkv.bias"]
        c_attn_w = qkv_w.reshape(nh, 3, hd, H).transpose(1, 0, 2, 3).reshape(3 * nh * hd, H).T
        c_attn_b = qkv_b.reshape(nh, 3, hd).transpose(1, 0, 2).reshape(3 * nh * hd)
        out += [(hp + "ln_1.weight", w[mp + "input_layernorm.weight"]),
                (hp + "ln_1.bias", w[mp + "input_layernorm.bias"]),
                # Buffers GPT2Attention registers; tessera must ignore them.
                (hp + "attn.bias", np.tril(np.ones((T, T), np.float32)).reshape(1, 1, T, T)),
                (hp + "attn.masked_bias", np.array(-1e4, np.float32)),
                (hp + "attn.c_attn.weight", c_attn_w),
                (hp + "attn.c_attn.bias", c_attn_b),
                (hp + "attn.c_proj.weight", w[mp + "self_attention.linear_proj.weight"].T),
                (hp + "attn.c_proj.bias", w[mp + "self_attention.linear_proj.bias"]),
                (hp + "ln_2.weight", w[mp + "pre_mlp_layernorm.weight"]),
                (hp + "ln_2.bias", w[mp + "pre_mlp_layernorm.bias"]),
                (hp + "mlp.c_fc.weight", w[mp + "mlp.linear_fc1.weight"].T),
                (hp + "mlp.c_fc.bias", w[mp + "mlp.linear_fc1.bias"]),
                (hp + "mlp.c_proj.weight", w[mp + "mlp.linear_fc2.weight"].T),
                (hp + "mlp.c_proj.bias", w[mp + "mlp.linear_fc2.bias"])]
    out += [("transformer.ln_f.weight", w["decoder.final_layernorm.weight"]),
            ("transformer.ln_f.bias", w["decoder.final_layernorm.bias"])]
    return [(k, np.ascontiguousarray(v, dtype=np.float32)) for k, v in out]


def hf_config(m):
    return {
        "architectures": ["GPT2LMHeadModel"],
        "model_type": "gpt2",
        "activation_function": "gelu_new",
        "n_layer": m["num_layers"],
        "n_embd": m["hidden_size"],
        "n_head": m["num_attention_heads"],
        "n_inner": None,
        "n_positions": m["max_position_embeddings"],
        "n_ctx": m["max_position_embeddings"],
        "vocab_size": m["vocab_size"],
        "layer_norm_epsilon": m["norm_epsilon"],
        "initializer_range": m["init_method_std"],
        "attn_pdrop": 0.0, "embd_pdrop": 0.0, "resid_pdrop": 0.0,
        "scale_attn_weights": True,
        "tie_word_embeddings": True,
        "bos_token_id": m["vocab_size"] - 1,
        "eos_token_id": m["vocab_size"] - 1,
        "torch_dtype": "float32",
    }


def hf_forward(t, m, tokens):
    """GPT-2 as Hugging Face computes it, on the HF tensors (a check on to_hf's layout)."""
    B, T = tokens.shape
    H, nh = m["hidden_size"], m["num_attention_heads"]
    hd = H // nh
    eps = m["norm_epsilon"]
    g = lambda n: t["transformer." + n]  # noqa: E731
    x = g("wte.weight")[tokens] + g("wpe.weight")[:T][None]
    future = torch.triu(torch.ones(T, T, dtype=torch.bool), diagonal=1)
    heads = lambda z: z.view(B, T, nh, hd).transpose(1, 2)  # noqa: E731
    for i in range(m["num_layers"]):
        h = "h.%d." % i
        a = torch.nn.functional.layer_norm(x, (H,), g(h + "ln_1.weight"), g(h + "ln_1.bias"), eps)
        q, k, v = (a @ g(h + "attn.c_attn.weight") + g(h + "attn.c_attn.bias")).split(H, dim=2)
        att = torch.softmax((heads(q) @ heads(k).transpose(-1, -2) / math.sqrt(hd))
                            .masked_fill(future, float("-inf")), dim=-1)
        y = (att @ heads(v)).transpose(1, 2).reshape(B, T, H)
        x = x + y @ g(h + "attn.c_proj.weight") + g(h + "attn.c_proj.bias")
        a = torch.nn.functional.layer_norm(x, (H,), g(h + "ln_2.weight"), g(h + "ln_2.bias"), eps)
        f = torch.nn.functional.gelu(a @ g(h + "mlp.c_fc.weight") + g(h + "mlp.c_fc.bias"),
                                     approximate="tanh")
        x = x + f @ g(h + "mlp.c_proj.weight") + g(h + "mlp.c_proj.bias")
    x = torch.nn.functional.layer_norm(x, (H,), g("ln_f.weight"), g("ln_f.bias"), eps)
    return x @ g("wte.weight").T


def train(w, m, c, tokens):
    """tokens [iters, gbs, T+1]. Returns per-iteration lm_loss, grad_norm, lr, clipped, and the
    final weights (float64 torch tensors)."""
    p = torch_params(w)
    names = [n for n, _ in param_names(m)]
    lm_loss, grad_norm, lrs, clipped = megatron_training.train(
        p, names, c, tokens, lambda batch: token_mean_loss(megatron_forward(p, m, batch[:, :-1]), batch[:, 1:]))
    return lm_loss, grad_norm, lrs, clipped, {n: p[n].detach() for n in names}


def megatron_args(m, c, hf_dir):
    a = {
        "--num-layers": m["num_layers"], "--hidden-size": m["hidden_size"],
        "--num-attention-heads": m["num_attention_heads"], "--seq-length": m["seq_length"],
        "--max-position-embeddings": m["max_position_embeddings"],
        "--tokenizer-type": "NullTokenizer", "--vocab-size": m["vocab_size"] - 1,  # Null: N+1
        "--make-vocab-size-divisible-by": m["make_vocab_size_divisible_by"],
        "--norm-epsilon": m["norm_epsilon"],
        "--hidden-dropout": 0.0, "--attention-dropout": 0.0,
    }
    return megatron_training.flags(a) + megatron_training.optimizer_args(c) + [
        "--init-from-hf", hf_dir, "--transformer-impl", "local"]


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--out", required=True, help="output folder (created)")
    ap.add_argument("--seed", type=int, default=1234)
    args = ap.parse_args()
    t0 = time.time()
    torch.manual_seed(args.seed)
    torch.set_num_threads(min(2, torch.get_num_threads()))
    m, c = MODEL, TRAIN
    rng = np.random.RandomState(args.seed)
    V, T, B = m["vocab_size"], m["seq_length"], FORWARD_BATCH
    hf_dir = os.path.join(args.out, "hf")
    os.makedirs(hf_dir, exist_ok=True)

    # a) weights, and the same weights as a Hugging Face GPT-2 folder.
    w = init_weights(m, rng)
    hf = to_hf(w, m)
    safetensors_io.write(os.path.join(hf_dir, "model.safetensors"), [(k, "F32", v) for k, v in hf],
                         metadata={"format": "pt"})
    with open(os.path.join(hf_dir, "config.json"), "w") as f:
        json.dump(hf_config(m), f, indent=2)

    # b) one forward/backward.
    tokens = rng.randint(0, V, size=(B, T + 1)).astype(np.int32)
    tok = torch.tensor(tokens, dtype=torch.long)
    p = torch_params(w)
    logits = megatron_forward(p, m, tok[:, :-1])
    loss = token_mean_loss(logits, tok[:, 1:])
    loss.backward()

    # The HF layout must compute the same function (checks to_hf's transposes and permutation
    # independently of tessera's loader).
    with torch.no_grad():
        hf_logits = hf_forward({k: torch.tensor(v, dtype=torch.float64) for k, v in hf}, m, tok[:, :-1])
        diff = (hf_logits - logits[..., :V]).abs().max().item()
        assert diff < 1e-10, "HF-layout forward differs from the Megatron-layout one by %g" % diff

    fwd = [("tokens", "I32", tokens),
           ("logits", "F32", logits.detach().numpy().astype(np.float32)),
           ("loss", "F32", np.array([loss.item()], np.float32))]
    fwd += [("grad." + n, "F32", p[n].grad.numpy().astype(np.float32)) for n, _ in param_names(m)]
    fwd += [("megatron." + n, "F32", w[n]) for n, _ in param_names(m)]
    safetensors_io.write(os.path.join(args.out, "expected_forward.safetensors"), fwd)

    # c) ten iterations of Megatron's training step.
    train_tokens = rng.randint(0, V, size=(c["train_iters"], c["global_batch_size"], T + 1)).astype(np.int32)
    lm_loss, grad_norm, lrs, clipped, final = train(w, m, c, train_tokens)
    margins = [abs(n - c["clip_grad"]) / c["clip_grad"] for n in grad_norm]
    if args.seed == 1234:
        assert any(clipped) and min(margins) > 0.01, (grad_norm, c["clip_grad"])
    safetensors_io.write(os.path.join(args.out, "expected_train.safetensors"), [
        ("tokens", "I32", train_tokens),
        ("lm_loss", "F32", np.array(lm_loss, np.float32)),
        ("grad_norm", "F32", np.array(grad_norm, np.float32)),
        ("lr", "F32", np.array(lrs, np.float32)),
    ])
    # Not part of the loss-curve check: the weights after the last update, which see weight
    # decay and the Adam details far more sharply than the losses do.
    safetensors_io.write(os.path.join(args.out, "expected_train_final.safetensors"),
                         [(n, "F32", final[n].numpy().astype(np.float32)) for n, _ in param_names(m)])

    cfg = {
        "reference_dtype": "float64",
        "seed": args.seed,
        "model": m,
        "train": c,
        "forward_batch_size": B,
        "init_from_hf": "hf",
        **megatron_training.SEMANTICS,
        "clipped_iterations": [i + 1 for i, x in enumerate(clipped) if x],
        "megatron_args": megatron_args(m, c, os.path.join(os.path.abspath(args.out), "hf")),
    }
    with open(os.path.join(args.out, "train_config.json"), "w") as f:
        json.dump(cfg, f, indent=2)
    print("gpt_reference: loss %.6f, lm_loss %s, grad_norm %s, clipped iterations %s, %.1f s" % (
        loss.item(), ["%.5f" % x for x in lm_loss], ["%.4f" % x for x in grad_norm],
        cfg["clipped_iterations"], time.time() - t0))


if __name__ == "__main__":
    main()
