#!/usr/bin/python3
"""Checks a Llama or Qwen2 Hugging Face folder written by `tessera ckpt export-hf` with
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

import numpy as np
import torch

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, HERE)
import safetensors_io  # noqa: E402
from llama_reference import import_transformers  # noqa: E402

MODEL_FIELDS = ("architectures", "model_type", "vocab_size", "hidden_size", "intermediate_size", "num_hidden_layers",
                "num_attention_heads", "num_key_value_heads", "head_dim", "hidden_act", "rms_norm_eps", "rope_theta",
                "rope_scaling", "attention_bias", "mlp_bias", "tie_word_embeddings")


def load_model(hf_dir):
    transformers = import_transformers()
    model, info = transformers.AutoModelForCausalLM.from_pretrained(
        hf_dir, torch_dtype=torch.float32, attn_implementation="eager", output_loading_info=True)
    problems = {k: v for k, v in info.items() if v}
    assert not problems, "transformers loaded %s with %s" % (hf_dir, problems)
    return model.eval()


def check_logits(hf_dir, expected, rtol):
    model = load_model(hf_dir)
    exp, _, _ = safetensors_io.read(expected, strict=False)
    tokens = torch.tensor(safetensors_io.array(exp["tokens"]).astype(np.int64))
    want = torch.tensor(safetensors_io.array(exp["logits"]).astype(np.float64))[..., :model.config.vocab_size]
    with torch.no_grad():
        got = model(input_ids=tokens, use_cache=False).logits.double()
    assert got.shape == want.shape, (got.shape, want.shape)
    diff = (got - want).abs().max().item()
    scale = want.abs().max().item()
    print("llama_hf_check: %s logits %s, max |diff| %.3g, max |logit| %.3g, relative %.3g (tolerance %g)" % (
        model.config.architectures[0], list(got.shape), diff, scale, diff / scale, rtol))
    return diff <= rtol * scale


def check_same(hf_dir, ref_dir):
    load_model(hf_dir)
    cfg, ref_cfg = (json.load(open(os.path.join(d, "config.json"))) for d in (hf_dir, ref_dir))
    ok = True
    for key in MODEL_FIELDS:
        if cfg.get(key) != ref_cfg.get(key):
            print("config.json: %s is %r, the reference has %r" % (key, cfg.get(key), ref_cfg.get(key)))
            ok = False
    tensors, _, _ = safetensors_io.read(os.path.join(hf_dir, "model.safetensors"), strict=False)
    ref, _, _ = safetensors_io.read(os.path.join(ref_dir, "model.safetensors"), strict=False)
    if set(tensors) != set(ref):
        print("tensor names differ: missing %s, extra %s" % (sorted(set(ref) - set(tensors)),
                                                              sorted(set(tensors) - set(ref))))
        ok = False
    for n in sorted(set(ref) & set(tensors)):
        a, b = tensors[n], ref[n]
        if a["dtype"] != b["dtype"] or a["shape"] != b["shape"] or a["raw"] != b["raw"]:
            print("tensor %s differs: %s %s vs %s %s" % (n, a["dtype"], a["shape"], b["dtype"], b["shape"]))
            ok = False
    print("llama_hf_check: %d tensors %s" % (len(ref), "identical" if ok else "DIFFER"))
    return ok


def main(argv):
    if len(argv) >= 4 and argv[1] == "logits":
        rtol = float(argv[argv.index("--rtol") + 1]) if "--rtol" in argv else 1e-5
        return 0 if check_logits(argv[2], argv[3], rtol) else 1
    if len(argv) == 4 and argv[1] == "same":
        return 0 if check_same(argv[2], argv[3]) else 1
    sys.stderr.write(__doc__)
    return 2


if __name__ == "__main__":
    torch.set_num_threads(1)
    sys.exit(main(sys.argv))
