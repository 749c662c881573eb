#!/usr/bin/python3
"""Checks a Llama, Qwen2, Mixtral or Qwen2-MoE Hugging Face folder written by `tessera ckpt export-hf` with
`transformers` itself: the folder must load with AutoModelForCausalLM.from_pretrained (no
missing, unexpected or mismatched tensors) and compute what tessera computes.

    llama_hf_check.py logits HF_DIR EXPECTED.safetensors [--rtol 1e-5]
        EXPECTED holds tokens I32 [B, T] and logits F32 [B, T, >= vocab_size] (tessera's
        forward of the checkpoint); transformers' float32 logits (eager attention) must match
        the first vocab_size columns: max |diff| <= rtol * max |logits|.
    llama_hf_check.py same HF_DIR REF_DIR
        every tensor of REF_DIR/model.safetensors is in HF_DIR's with the same dtype, shape and
        bytes, there is nothing else, and the model fields of config.json agree.
Exit status 0 when the check holds, 1 when not.
"""
import json
import os
import sys

import torch

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, HERE)
import hf_check_common  # noqa: E402
import safetensors_io  # noqa: E402
from llama_reference import import_transformers  # noqa: E402

MODEL_FIELDS = ("architectures", "model_type", "vocab_size", "hidden_size", "intermediate_size", "num_hidden_layers",
                "num_attention_heads", "num_key_value_heads", "head_dim", "hidden_act", "rms_norm_eps", "rope_theta",
                "rope_scaling", "attention_bias", "mlp_bias", "tie_word_embeddings",
                # Mixtral's and Qwen2-MoE's experts
                "num_local_experts", "num_experts", "num_experts_per_tok", "moe_intermediate_size",
                "shared_expert_intermediate_size", "norm_topk_prob", "decoder_sparse_step", "mlp_only_layers")


def load_model(hf_dir):
    transformers = import_transformers()
    model, info = transformers.AutoModelForCausalLM.from_pretrained(
        hf_dir, torch_dtype=torch.float32, attn_implementation="eager", output_loading_info=True)
    problems = {k: v for k, v in info.items() if v}
    assert not problems, "transformers loaded %s with %s" % (hf_dir, problems)
    return model.eval()


def check_logits(hf_dir, expected, rtol):
    model = load_model(hf_dir)
    tokens, want = hf_check_common.expected_logits(expected, model.config.vocab_size)
    with torch.no_grad():
        got = model(input_ids=tokens, use_cache=False).logits.double()
    return hf_check_common.logits_agree("llama_hf_check: " + model.config.architectures[0], got, want, rtol)


def check_same(hf_dir, ref_dir):
    load_model(hf_dir)
    cfg, ref_cfg = (json.load(open(os.path.join(d, "config.json"))) for d in (hf_dir, ref_dir))
    tensors, _, _ = safetensors_io.read(os.path.join(hf_dir, "model.safetensors"), strict=False)
    ref, _, _ = safetensors_io.read(os.path.join(ref_dir, "model.safetensors"), strict=False)
    return hf_check_common.folders_agree("llama_hf_check", cfg, ref_cfg, MODEL_FIELDS, tensors, ref)


if __name__ == "__main__":
    sys.exit(hf_check_common.main(sys.argv, __doc__, check_logits, check_same))
