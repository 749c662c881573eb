#!/usr/bin/python3
"""Float64 reference for tessera's mixture of experts: a tiny random `transformers`
MixtralForCausalLM (or, with --family qwen2_moe, Qwen2MoeForCausalLM with its gated shared
expert), saved as a Hugging Face folder and trained 10 iterations in float64 with Megatron-LM's
optimizer (megatron_training.py) and Megatron's router aux loss.

The model is transformers' own (modeling_mixtral.py / modeling_qwen2_moe.py, eager attention),
made Megatron's GPT on the same weights as llama_reference.py does (lm_head padded with zero rows
to the padded vocabulary, RMSNorm statistics in float64). Its routing is Megatron's: Mixtral's
normalised top-k of the softmax is the softmax over the top-k logits (Megatron's default),
Qwen2-MoE's un-normalised top-k (norm_topk_prob false) is --moe-router-pre-softmax. transformers
takes the routing softmax in float32 (dtype=torch.float) as Megatron does; that rounding is far
below the tests' tolerances.

Each micro-batch's loss is transformers' logits' token-mean cross-entropy plus, for the gradient
only, Megatron's switch load-balancing loss of every layer (switch_load_balancing_loss_func in
megatron/core/transformer/moe/moe_utils.py, written out again below from the router logits
transformers returns): sum_e (sum_n softmax(logits)[n,e]) * tokens_per_expert[e] * E * coeff /
(N^2 k). Its gradient reaches the router with the main loss's 1/micro-batches, as Megatron's
MoEAuxLossAutoScaler gives it. Megatron logs load_balancing_loss as the mean over layers of each
layer's aux loss / coeff, summed over micro-batches / micro-batches (track_moe_metrics).

    /usr/bin/python3 tests/reference/moe_reference.py --out DIR [--family mixtral|qwen2_moe]
Writes DIR/hf (save_pretrained, float32), DIR/expected_train.safetensors (tokens, lm_loss,
grad_norm, load_balancing_loss, grad_norm_without_aux [10]), DIR/train_config.json (megatron_args:
the `tessera train` flags).
"""
import argparse
import json
import os
import sys
import time

import numpy as np
import torch

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, HERE)
import llama_reference  # noqa: E402
import megatron_training  # noqa: E402
import safetensors_io  # noqa: E402
from llama_reference import import_transformers, mock_training_tokens, rms_norm_float64  # noqa: E402
from megatron_training import token_mean_loss  # noqa: E402

MODEL = dict(llama_reference.MODEL, ffn_hidden_size=64, num_experts=4, topk=2, shared_ffn=48)
AUX_LOSS_COEFF = 0.01
# Clipping between this run's grad norms, as llama_reference.py's.
TRAIN = dict(megatron_training.TRAIN, clip_grad=0.08)
# The final norm's weights, small: the language-model gradients (mostly the output layer's and
# the embedding's) shrink with it while the aux loss's (the routers') do not, so that the aux
# term moves the grad norm by ~10 % and a missing or wrong one shows.
FINAL_NORM_SCALE = 0.03


def hf_config(transformers, m, family):
    common = dict(
        vocab_size=m["vocab_size"], hidden_size=m["hidden_size"], num_hidden_layers=m["num_layers"],
        num_attention_heads=m["num_attention_heads"], num_key_value_heads=m["num_query_groups"], hidden_act="silu",
        max_position_embeddings=m["max_position_embeddings"], rms_norm_eps=m["norm_epsilon"],
        rope_theta=float(m["rotary_base"]), attention_dropout=0.0, tie_word_embeddings=False,
        initializer_range=m["init_method_std"], num_experts_per_tok=m["topk"], router_aux_loss_coef=AUX_LOSS_COEFF,
        bos_token_id=m["vocab_size"] - 1, eos_token_id=m["vocab_size"] - 1, torch_dtype="float32")
    if family == "mixtral":
        return transformers.MixtralConfig(intermediate_size=m["ffn_hidden_size"], num_local_experts=m["num_experts"],
                                          head_dim=m["kv_channels"], sliding_window=None, **common)
    return transformers.Qwen2MoeConfig(intermediate_size=m["ffn_hidden_size"], moe_intermediate_size=m["ffn_hidden_size"],
                                       shared_expert_intermediate_size=m["shared_ffn"], num_experts=m["num_experts"],
                                       norm_topk_prob=False, decoder_sparse_step=1, use_sliding_window=False, **common)


def model_class(transformers, family):
    return transformers.MixtralForCausalLM if family == "mixtral" else transformers.Qwen2MoeForCausalLM


def make_model(transformers, m, family, seed):
    """Random float32 weights: transformers' init, norms 1 + noise, routers 5x sharper (so that
    routing is decided by clear margins and the aux loss matters)."""
    torch.manual_seed(seed)
    model = model_class(transformers, family)(hf_config(transformers, m, family)).float()
    with torch.no_grad():
        for name, p in model.named_parameters():
            if name.endswith("norm.weight"):
                p.copy_((FINAL_NORM_SCALE if name == "model.norm.weight" else 1.0) * (1.0 + 0.1 * torch.randn_like(p)))
            elif name.endswith(("block_sparse_moe.gate.weight", "mlp.gate.weight", "shared_expert_gate.weight")):
                p.mul_(5.0)
            elif name.endswith("_proj.bias"):
                p.copy_(0.02 * torch.randn_like(p))
    return model


def float64_model(transformers, hf_dir, m, family):
    module = transformers.models.mixtral.modeling_mixtral if family == "mixtral" else \
        transformers.models.qwen2_moe.modeling_qwen2_moe
    (module.MixtralRMSNorm if family == "mixtral" else module.Qwen2MoeRMSNorm).forward = rms_norm_float64
    model = model_class(transformers, family).from_pretrained(hf_dir, torch_dtype=torch.float64,
                                                              attn_implementation="eager")
    V, Vp, H = m["vocab_size"], m["padded_vocab_size"], m["hidden_size"]
    head = torch.nn.Linear(H, Vp, bias=False, dtype=torch.float64)
    with torch.no_grad():
        head.weight.zero_()
        head.weight[:V] = model.lm_head.weight
    model.lm_head = head
    model.config.use_cache = False
    return model


def switch_aux_loss(logits, k, coeff, pre_softmax):
    """Megatron's switch_load_balancing_loss_func on one layer's router logits [N, E] (one rank,
    no sequence partition): the experts chosen as TopKRouter chooses them."""
    N, E = logits.shape
    scores = torch.softmax(logits, dim=-1)
    top = torch.topk(scores if pre_softmax else logits, k, dim=-1).indices
    tokens_per_expert = torch.zeros(E, dtype=logits.dtype).scatter_add_(
        0, top.reshape(-1), torch.ones(N * k, dtype=logits.dtype))
    return (scores.sum(0) * tokens_per_expert).sum() * E * coeff / (N * N * k)


def train(model, m, c, tokens, family, with_aux):
    params = dict(model.named_parameters())
    lb = []

    def micro_batch_loss(batch):
        out = model(input_ids=batch[:, :-1], output_router_logits=True, use_cache=False)
        lm = token_mean_loss(out.logits, batch[:, 1:])
        aux = sum(switch_aux_loss(r, m["topk"], AUX_LOSS_COEFF, family == "qwen2_moe") for r in out.router_logits)
        lb.append([switch_aux_loss(r, m["topk"], AUX_LOSS_COEFF, family == "qwen2_moe").item() / AUX_LOSS_COEFF
                   for r in out.router_logits])
        return lm + (aux - aux.detach()) if with_aux else lm

    lm_loss, grad_norm, _, _ = megatron_training.train(params, list(params), c, tokens, micro_batch_loss)
    per_iter = np.array(lb).reshape(c["train_iters"], c["num_microbatches"], m["num_layers"])
    return lm_loss, grad_norm, per_iter.sum(axis=1).mean(axis=1) / c["num_microbatches"]


def megatron_args(m, c, hf_dir, seed, family):
    a = llama_reference.megatron_args(m, c, hf_dir, seed)
    a += ["--num-experts", str(m["num_experts"]), "--moe-router-topk", str(m["topk"]),
          "--moe-ffn-hidden-size", str(m["ffn_hidden_size"]), "--moe-aux-loss-coeff", str(AUX_LOSS_COEFF)]
    if family == "qwen2_moe":
        a += ["--moe-router-pre-softmax", "--moe-shared-expert-intermediate-size", str(m["shared_ffn"]),
              "--moe-shared-expert-gate", "--add-qkv-bias"]
    return a


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--out", required=True)
    ap.add_argument("--family", choices=["mixtral", "qwen2_moe"], default="mixtral")
    ap.add_argument("--seed", type=int, default=1234)
    args = ap.parse_args()
    t0 = time.time()
    transformers = import_transformers()
    torch.set_num_threads(min(2, torch.get_num_threads()))
    m, c = dict(MODEL), dict(TRAIN)
    hf_dir = os.path.join(args.out, "hf")
    make_model(transformers, m, args.family, args.seed).save_pretrained(hf_dir, safe_serialization=True)
    tokens = mock_training_tokens(m, c, args.seed)
    lm_loss, grad_norm, lb = train(float64_model(transformers, hf_dir, m, args.family), m, c, tokens, args.family, True)
    _, grad_norm_without_aux, _ = train(float64_model(transformers, hf_dir, m, args.family), m, c, tokens, args.family,
                                        False)
    safetensors_io.write(os.path.join(args.out, "expected_train.safetensors"), [
        ("tokens", "I32", tokens),
        ("lm_loss", "F32", np.array(lm_loss, np.float32)),
        ("grad_norm", "F32", np.array(grad_norm, np.float32)),
        ("load_balancing_loss", "F32", np.array(lb, np.float32)),
        ("grad_norm_without_aux", "F32", np.array(grad_norm_without_aux, np.float32)),
    ])
    cfg = {"reference_dtype": "float64", "family": args.family, "transformers": transformers.__version__,
           "torch": torch.__version__, "model": m, "train": c, "moe_aux_loss_coeff": AUX_LOSS_COEFF,
           "megatron_args": megatron_args(m, c, os.path.abspath(hf_dir), args.seed, args.family)}
    with open(os.path.join(args.out, "train_config.json"), "w") as f:
        json.dump(cfg, f, indent=2)
    print("moe_reference (%s): lm_loss %s, grad_norm %s (%s without the aux loss), load_balancing_loss %s, %.1f s" % (
        args.family, ["%.5f" % x for x in lm_loss], ["%.4f" % x for x in grad_norm],
        ["%.4f" % x for x in grad_norm_without_aux], ["%.4f" % x for x in lb], time.time() - t0))


if __name__ == "__main__":
    main()
