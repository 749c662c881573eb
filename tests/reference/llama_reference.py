#!/usr/bin/python3
"""Float64 reference for tessera's Llama family: a tiny random `transformers` LlamaForCausalLM
(grouped-query attention NH 4 / NG 2, RMSNorm eps 1e-5, RoPE base 10000, SwiGLU, no biases,
untied output layer, vocabulary 100 padded to 128), saved as a Hugging Face folder and trained
10 iterations with Megatron-LM's optimizer semantics (megatron_training.py) in float64.

The model is transformers' own LlamaForCausalLM (modeling_llama.py, eager attention), run in
float64 with two adjustments that make it Megatron's GPT on the same weights:
  - lm_head is widened to the padded vocabulary with zero rows, as --init-from-hf pads
    output_layer, so the loss is the cross-entropy over all 128 columns and the padding rows
    train (they see gradient through the softmax);
  - LlamaRMSNorm's statistics stay in float64 (transformers casts to float32 for its usual
    bf16/fp16 models, which in a float64 model would be a downcast).
RoPE's angles are float32 in transformers as in Megatron (rope_utils.py): the same function.
Eager attention takes its softmax in float32 (as Megatron's --attention-softmax-in-fp32 does);
that rounding, about 3e-8 in the logits here (1e-6 of them with --init-method-std 0.2), is
over two orders below the tests' tolerances.

    /usr/bin/python3 tests/reference/llama_reference.py --out DIR [--seed S]
        [--seq-length T] [--rotary-base B] [--rope-scaling-factor F] [--vocab-size V] [--train-iters N]

The options vary the model: --rope-scaling-factor F gives it Llama 3.1's RoPE scaling
(rope_type "llama3", factor F, low/high frequency factors 1 and 4, original context 8192:
Megatron's --use-rope-scaling), which the Megatron-layout check below writes out again.

transformers comes from the test venv (/opt/tessera/test-venv: 4.47.1, the same Python 3.11)
and torch from Debian's python3-torch; run with the tools venv's python
(/opt/tessera/tools-venv: transformers 5, torch 2, megatron-core) the model is transformers 5's
and its folder has transformers 5's config.json (rope_parameters). Writes
  DIR/hf/config.json, DIR/hf/model.safetensors   save_pretrained's LlamaForCausalLM, float32.
  DIR/hf_sharded/   the same model saved in shards with model.safetensors.index.json.
  DIR/expected_forward.safetensors
      tokens I32 [2, 17]; logits F32 [2, 16, 128]; loss F32 [1];
      grad.<megatron name> and megatron.<megatron name> F32: the gradient of that loss and the
      initial weights in Megatron's layout (megatron_layout below, an implementation of the
      mapping independent of tessera's C++ one).
  DIR/expected_train.safetensors   tokens I32 [10, 4, 17]; lm_loss, grad_norm, lr F32 [10]. The
      tokens are those of `tessera train --mock-data` (mock_training_tokens), so that the CLI
      in any parallel layout trains on exactly the reference's batches.
  DIR/expected_train_final.safetensors   <megatron name> F32 after the 10th update.
  DIR/train_config.json   hyper-parameters and megatron_args, the `tessera train` flags.
"""
import argparse
import json
import math
import os
import sys
import time

import numpy as np
import torch

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, HERE)
sys.path.insert(0, os.path.join(HERE, "data"))
import gpt_dataset_reference  # noqa: E402
import megatron_training  # noqa: E402
import safetensors_io  # noqa: E402
from megatron_training import token_mean_loss  # noqa: E402

VENV_SITE = "/opt/tessera/test-venv/lib/python%d.%d/site-packages" % sys.version_info[:2]


def import_transformers():
    """transformers from the test venv; appended, so that Debian's numpy (which its torch was
    built against) wins over the venv's."""
    if not os.path.isdir(VENV_SITE):
        sys.exit("llama_reference: %s is missing; run scripts/setup.sh (the test venv)" % VENV_SITE)
    if VENV_SITE not in sys.path:
        sys.path.append(VENV_SITE)
    import transformers  # noqa: E402
    return transformers


MODEL = {
    "num_layers": 2,
    "hidden_size": 64,
    "num_attention_heads": 4,
    "num_query_groups": 2,
    "kv_channels": 16,
    "ffn_hidden_size": 128,
    "seq_length": 16,
    "max_position_embeddings": 16,
    "vocab_size": 100,
    "make_vocab_size_divisible_by": 64,  # 128 rows for TP 1 and TP 2
    "padded_vocab_size": 128,
    "norm_epsilon": 1e-5,
    "rotary_base": 10000,
    "rope_scaling_factor": None,  # Llama 3.1's scaling (--use-rope-scaling): the factor
    "init_method_std": 0.02,
}

# Megatron's optimizer, schedule and batch as for GPT; the clip threshold sits between this
# run's grad norms (see clipped_iterations) so that some iterations clip and others do not.
TRAIN = dict(megatron_training.TRAIN, clip_grad=1.95)

FORWARD_BATCH = 2


def mock_training_tokens(m, c, seed):
    """tokens [iters, gbs, T+1]: the samples `tessera train --mock-data --seed SEED` trains on,
    Megatron's MockGPTDataset as gpt_dataset_reference.py rebuilds it (split 1,1,1; one epoch,
    so the number of samples asked for does not change them), with ids modulo the vocabulary
    as tessera reduces the mock documents' (train/training_data.h). Iteration i's global
    batch is samples [i*gbs, (i+1)*gbs)."""
    V, T = m["vocab_size"], m["seq_length"]
    iters, gbs = c["train_iters"], c["global_batch_size"]
    config = gpt_dataset_reference.Config({"seed": seed, "seq_length": T, "tokenizer": {}, "eod": V - 1})
    low = gpt_dataset_reference.MockLowLevelDataset(config.eod)
    beg, end = (int(round(x * float(len(low)))) for x in config.split_matrix[0])
    train = gpt_dataset_reference.GPTDataset(low, None, np.arange(beg, end, dtype=np.int32), iters * gbs, "train",
                                             config, "MockGPTDataset")
    samples = np.stack([train[i] for i in range(iters * gbs)]) % V
    return samples.reshape(iters, gbs, T + 1).astype(np.int32)


def llama3_rope_scaling(m):
    """config.json's rope_scaling (transformers 5: rope_parameters) for Megatron's
    --use-rope-scaling with m's factor; None without scaling."""
    if m["rope_scaling_factor"] is None:
        return None
    return {"rope_type": "llama3", "factor": float(m["rope_scaling_factor"]), "low_freq_factor": 1.0,
            "high_freq_factor": 4.0, "original_max_position_embeddings": 8192}


def hf_config(transformers, m):
    return transformers.LlamaConfig(
        vocab_size=m["vocab_size"], hidden_size=m["hidden_size"], intermediate_size=m["ffn_hidden_size"],
        num_hidden_layers=m["num_layers"], num_attention_heads=m["num_attention_heads"],
        num_key_value_heads=m["num_query_groups"], head_dim=m["kv_channels"], hidden_act="silu",
        max_position_embeddings=m["max_position_embeddings"], rms_norm_eps=m["norm_epsilon"],
        rope_theta=float(m["rotary_base"]), rope_scaling=llama3_rope_scaling(m), attention_bias=False, mlp_bias=False,
        attention_dropout=0.0, tie_word_embeddings=False, initializer_range=m["init_method_std"],
        bos_token_id=m["vocab_size"] - 1, eos_token_id=m["vocab_size"] - 1, torch_dtype="float32")


def make_model(transformers, m, seed):
    """A random float32 LlamaForCausalLM: transformers' init (normal(0, 0.02) linears), with
    norm weights 1 + noise so that their gradients are exercised."""
    torch.manual_seed(seed)
    model = transformers.LlamaForCausalLM(hf_config(transformers, m)).float()
    with torch.no_grad():
        for name, p in model.named_parameters():
            if name.endswith("norm.weight"):
                p.copy_(1.0 + 0.1 * torch.randn_like(p))
    return model


def rms_norm_float64(self, x):
    return self.weight * (x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + self.variance_epsilon))


def float64_model(transformers, hf_dir, m):
    """The saved model, loaded back as float64 with lm_head padded to the padded vocabulary."""
    transformers.models.llama.modeling_llama.LlamaRMSNorm.forward = rms_norm_float64
    model = transformers.LlamaForCausalLM.from_pretrained(hf_dir, torch_dtype=torch.float64,
                                                          attn_implementation="eager")
    V, Vp, H = m["vocab_size"], m["padded_vocab_size"], m["hidden_size"]
    head = torch.nn.Linear(H, Vp, bias=False, dtype=torch.float64)
    with torch.no_grad():
        head.weight.zero_()
        head.weight[:V] = model.lm_head.weight
    model.lm_head = head
    model.config.use_cache = False
    return model


def logits_of(model, inputs):
    return model(input_ids=inputs, use_cache=False).logits


def megatron_layout(hf, m):
    """HF LlamaForCausalLM tensors (name -> torch tensor) -> Megatron's names and layouts
    (megatron/core/transformer/attention.py's grouped QKV, mlp.py's [gate; up] fc1), full
    shapes; the embedding padded with zero rows, output_layer taken from the padded lm_head."""
    NH, NG, hd, H = m["num_attention_heads"], m["num_query_groups"], m["kv_channels"], m["hidden_size"]
    R, Vp = NH // NG, m["padded_vocab_size"]
    emb = hf["model.embed_tokens.weight"]
    out = {"embedding.word_embeddings.weight":
           torch.cat([emb, torch.zeros(Vp - emb.shape[0], H, dtype=emb.dtype)])}
    for i in range(m["num_layers"]):
        h, p = "model.layers.%d." % i, "decoder.layers.%d." % i
        q = hf[h + "self_attn.q_proj.weight"].reshape(NG, R, hd, H)
        k = hf[h + "self_attn.k_proj.weight"].reshape(NG, 1, hd, H)
        v = hf[h + "self_attn.v_proj.weight"].reshape(NG, 1, hd, H)
        out[p + "input_layernorm.weight"] = hf[h + "input_layernorm.weight"]
        out[p + "self_attention.linear_proj.weight"] = hf[h + "self_attn.o_proj.weight"]
        out[p + "self_attention.linear_qkv.weight"] = torch.cat([q, k, v], dim=1).reshape(-1, H)
        out[p + "pre_mlp_layernorm.weight"] = hf[h + "post_attention_layernorm.weight"]
        out[p + "mlp.linear_fc1.weight"] = torch.stack([hf[h + "mlp.gate_proj.weight"], hf[h + "mlp.up_proj.weight"]])
        out[p + "mlp.linear_fc2.weight"] = hf[h + "mlp.down_proj.weight"]
    out["decoder.final_layernorm.weight"] = hf["model.norm.weight"]
    out["output_layer.weight"] = hf["lm_head.weight"]
    return out


def rms_norm(x, w, eps):
    return x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + eps) * w


def llama3_scaled(inv_freq, factor, low=1.0, high=4.0, context=8192):
    """Megatron's --use-rope-scaling on fp32 inv_freq (RotaryEmbedding._apply_scaling in
    megatron/core/models/common/embeddings/rotary_pos_embedding.py), written out again: of
    wavelength w = 2 pi / f, w < context / high keeps f, w > context / low gives f / factor,
    and between the two s = (context / w - low) / (high - low) gives (1 - s) f / factor + s f."""
    wavelen = 2 * math.pi / inv_freq
    smooth = (context / wavelen - low) / (high - low)
    mixed = (1 - smooth) * inv_freq / factor + smooth * inv_freq
    return torch.where(wavelen < context / high, inv_freq, torch.where(wavelen > context / low, inv_freq / factor,
                                                                        mixed))


def rope(x, m):
    """Megatron's non-interleaved RoPE on x [B, heads, T, hd] (rope_utils.py): fp32 angles,
    channel j paired with j + hd/2; inv_freq scaled with m's rope_scaling_factor."""
    T, hd = x.shape[2], x.shape[3]
    inv_freq = 1.0 / (m["rotary_base"] ** (torch.arange(0, hd, 2, dtype=torch.float32) / hd))
    if m.get("rope_scaling_factor") is not None:
        inv_freq = llama3_scaled(inv_freq, m["rope_scaling_factor"])
    angles = torch.outer(torch.arange(T, dtype=torch.float32), inv_freq)
    emb = torch.cat([angles, angles], dim=-1)
    cos, sin = emb.cos().to(x.dtype), emb.sin().to(x.dtype)
    half = torch.cat([-x[..., hd // 2:], x[..., :hd // 2]], dim=-1)
    return x * cos + half * sin


def megatron_forward(w, m, tokens):
    """Megatron's GPT with the Llama flags on Megatron-layout weights, written from
    megatron/core/transformer/{attention,mlp}.py independently of transformers: tokens
    [B, T] -> logits [B, T, Vp]. A check on megatron_layout."""
    B, T = tokens.shape
    NH, NG, hd, H, F = (m["num_attention_heads"], m["num_query_groups"], m["kv_channels"], m["hidden_size"],
                        m["ffn_hidden_size"])
    R, eps = NH // NG, m["norm_epsilon"]
    future = torch.triu(torch.ones(T, T, dtype=torch.bool), diagonal=1)
    x = w["embedding.word_embeddings.weight"][tokens]
    for i in range(m["num_layers"]):
        p = "decoder.layers.%d." % i
        qkv = rms_norm(x, w[p + "input_layernorm.weight"], eps) @ w[p + "self_attention.linear_qkv.weight"].T
        qkv = qkv.view(B, T, NG, (R + 2) * hd)  # per group [q of R heads; k; v]
        q = qkv[..., :R * hd].reshape(B, T, NH, hd).transpose(1, 2)
        k = qkv[..., R * hd:(R + 1) * hd].transpose(1, 2).repeat_interleave(R, dim=1)
        v = qkv[..., (R + 1) * hd:].transpose(1, 2).repeat_interleave(R, dim=1)
        q, k = rope(q, m), rope(k, m)
        probs = torch.softmax((q @ k.transpose(-1, -2) / hd ** 0.5).masked_fill(future, -10000.0), dim=-1)
        ctx = (probs @ v).transpose(1, 2).reshape(B, T, NH * hd)
        x = x + ctx @ w[p + "self_attention.linear_proj.weight"].T
        fc1 = rms_norm(x, w[p + "pre_mlp_layernorm.weight"], eps) @ w[p + "mlp.linear_fc1.weight"].reshape(2 * F, H).T
        x = x + (torch.nn.functional.silu(fc1[..., :F]) * fc1[..., F:]) @ w[p + "mlp.linear_fc2.weight"].T
    x = rms_norm(x, w["decoder.final_layernorm.weight"], eps)
    return x @ w["output_layer.weight"].T


def as_f32(tensors, prefix=""):
    return [(prefix + n, "F32", t.detach().numpy().astype(np.float32)) for n, t in tensors.items()]


def megatron_args(m, c, hf_dir, seed):
    a = {
        "--num-layers": m["num_layers"], "--hidden-size": m["hidden_size"],
        "--num-attention-heads": m["num_attention_heads"], "--num-query-groups": m["num_query_groups"],
        "--kv-channels": m["kv_channels"], "--ffn-hidden-size": m["ffn_hidden_size"],
        "--seq-length": m["seq_length"], "--max-position-embeddings": m["max_position_embeddings"],
        "--position-embedding-type": "rope", "--rotary-base": m["rotary_base"],
        **({"--rope-scaling-factor": m["rope_scaling_factor"]} if m["rope_scaling_factor"] is not None else {}),
        "--normalization": "RMSNorm", "--norm-epsilon": m["norm_epsilon"],
        "--tokenizer-type": "NullTokenizer", "--vocab-size": m["vocab_size"] - 1,  # Null: N+1
        "--make-vocab-size-divisible-by": m["make_vocab_size_divisible_by"],
        "--hidden-dropout": 0.0, "--attention-dropout": 0.0, "--seed": seed,
    }
    return (megatron_training.flags(a) + ["--mock-data"] +
            (["--use-rope-scaling"] if m["rope_scaling_factor"] is not None else []) +
            ["--group-query-attention", "--swiglu", "--disable-bias-linear", "--untie-embeddings-and-output-weights"] +
            megatron_training.optimizer_args(c) + ["--init-from-hf", hf_dir, "--transformer-impl", "local"])


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--out", required=True, help="output folder (created)")
    ap.add_argument("--seed", type=int, default=1234)
    ap.add_argument("--seq-length", type=int, default=MODEL["seq_length"])
    ap.add_argument("--rotary-base", type=int, default=MODEL["rotary_base"])
    ap.add_argument("--rope-scaling-factor", type=float, default=None, help="Llama 3.1's RoPE scaling")
    ap.add_argument("--vocab-size", type=int, default=MODEL["vocab_size"])
    ap.add_argument("--train-iters", type=int, default=TRAIN["train_iters"])
    ap.add_argument("--init-method-std", type=float, default=MODEL["init_method_std"],
                    help="the weights' standard deviation; larger makes attention depend on position")
    args = ap.parse_args()
    t0 = time.time()
    transformers = import_transformers()
    torch.set_num_threads(min(2, torch.get_num_threads()))
    m = dict(MODEL, seq_length=args.seq_length, max_position_embeddings=args.seq_length, rotary_base=args.rotary_base,
             rope_scaling_factor=args.rope_scaling_factor, vocab_size=args.vocab_size,
             init_method_std=args.init_method_std)
    multiple = m["make_vocab_size_divisible_by"]
    m["padded_vocab_size"] = -(-m["vocab_size"] // multiple) * multiple
    c = dict(TRAIN, train_iters=args.train_iters)
    rng = np.random.RandomState(args.seed)
    V, T, B = m["vocab_size"], m["seq_length"], FORWARD_BATCH
    hf_dir = os.path.join(args.out, "hf")

    # a) the model as Hugging Face files, whole and sharded.
    model32 = make_model(transformers, m, args.seed)
    model32.save_pretrained(hf_dir, safe_serialization=True)
    model32.save_pretrained(os.path.join(args.out, "hf_sharded"), safe_serialization=True, max_shard_size="100KB")
    assert os.path.exists(os.path.join(args.out, "hf_sharded", "model.safetensors.index.json"))

    # b) one forward/backward of the float64 model.
    model = float64_model(transformers, hf_dir, m)
    params = dict(model.named_parameters())
    tokens = rng.randint(0, V, size=(B, T + 1)).astype(np.int32)
    tok = torch.tensor(tokens, dtype=torch.long)
    logits = logits_of(model, tok[:, :-1])
    loss = token_mean_loss(logits, tok[:, 1:])
    loss.backward()
    weights = megatron_layout({n: p.detach() for n, p in params.items()}, m)
    # transformers' model and Megatron's on the mapped weights compute the same function (up
    # to the float32 softmax of transformers' eager attention: ~3e-8 of the logits at the
    # default init, ~1e-6 with --init-method-std 0.2's sharper attention).
    with torch.no_grad():
        diff = (megatron_forward(weights, m, tok[:, :-1]) - logits).abs().max().item()
        scale = max(1.0, logits.abs().max().item())
        assert diff < 2e-6 * scale, "the Megatron-layout forward differs from transformers' by %g" % diff
    # The same loss with RoPE misread (base 10000; no scaling), which a parity test must tell
    # apart from the model's.
    misread = {}
    if m["rotary_base"] != 10000:
        misread["rope_base_10000"] = dict(m, rotary_base=10000)
    if m["rope_scaling_factor"] is not None:
        misread["without_rope_scaling"] = dict(m, rope_scaling_factor=None)
    with torch.no_grad():
        misread_loss = {k: token_mean_loss(megatron_forward(weights, mm, tok[:, :-1]), tok[:, 1:]).item()
                        for k, mm in misread.items()}
    grads = megatron_layout({n: p.grad for n, p in params.items()}, m)
    fwd = [("tokens", "I32", tokens), ("logits", "F32", logits.detach().numpy().astype(np.float32)),
           ("loss", "F32", np.array([loss.item()], np.float32))]
    safetensors_io.write(os.path.join(args.out, "expected_forward.safetensors"),
                         fwd + as_f32(grads, "grad.") + as_f32(weights, "megatron."))

    # c) ten iterations of Megatron's training step.
    train_tokens = mock_training_tokens(m, c, args.seed)
    lm_loss, grad_norm, lrs, clipped = megatron_training.train(
        params, list(params), c, train_tokens,
        lambda batch: token_mean_loss(logits_of(model, batch[:, :-1]), batch[:, 1:]))
    margins = [abs(n - c["clip_grad"]) / c["clip_grad"] for n in grad_norm]
    if args.seed == 1234 and m == MODEL and c == TRAIN:
        assert any(clipped) and not all(clipped) and min(margins) > 0.01, (grad_norm, c["clip_grad"])
    safetensors_io.write(os.path.join(args.out, "expected_train.safetensors"), [
        ("tokens", "I32", train_tokens),
        ("lm_loss", "F32", np.array(lm_loss, np.float32)),
        ("grad_norm", "F32", np.array(grad_norm, np.float32)),
        ("lr", "F32", np.array(lrs, np.float32)),
    ])
    final = megatron_layout({n: p.detach() for n, p in params.items()}, m)
    safetensors_io.write(os.path.join(args.out, "expected_train_final.safetensors"), as_f32(final))

    cfg = {
        "reference_dtype": "float64",
        "seed": args.seed,
        "transformers": transformers.__version__,
        "torch": torch.__version__,
        "model": m,
        "train": c,
        "forward_batch_size": B,
        "forward_loss": loss.item(),
        "forward_loss_misread": misread_loss,
        "init_from_hf": "hf",
        **megatron_training.SEMANTICS,
        "clipped_iterations": [i + 1 for i, x in enumerate(clipped) if x],
        "megatron_args": megatron_args(m, c, os.path.abspath(hf_dir), args.seed),
    }
    with open(os.path.join(args.out, "train_config.json"), "w") as f:
        json.dump(cfg, f, indent=2)
    print("llama_reference: loss %.6f, lm_loss %s, grad_norm %s, clipped iterations %s, %.1f s" % (
        loss.item(), ["%.5f" % x for x in lm_loss], ["%.4f" % x for x in grad_norm],
        cfg["clipped_iterations"], time.time() - t0))


if __name__ == "__main__":
    main()
