"""What the Hugging Face folder checks (hf_gpt2_check.py, llama_hf_check.py) share: the
logits comparison, the folder comparison and the command line

    <check>.py logits HF_DIR EXPECTED.safetensors [--rtol 1e-5]
    <check>.py same HF_DIR REF_DIR
"""
import os
import sys

import numpy as np
import torch

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import safetensors_io  # noqa: E402


def expected_logits(expected, vocab_size):
    """tokens (int64) and the first vocab_size columns of the logits (float64) in EXPECTED."""
    exp, _, _ = safetensors_io.read(expected, strict=False)
    tokens = torch.tensor(safetensors_io.array(exp["tokens"]).astype(np.int64))
    want = torch.tensor(safetensors_io.array(exp["logits"]).astype(np.float64))[..., :vocab_size]
    return tokens, want


def logits_agree(label, got, want, rtol):
    """max |got - want| <= rtol * max |want|, printed."""
    assert got.shape == want.shape, (got.shape, want.shape)
    diff = (got - want).abs().max().item()
    scale = want.abs().max().item()
    print("%s logits %s, max |diff| %.3g, max |logit| %.3g, relative %.3g (tolerance %g)" % (
        label, list(got.shape), diff, scale, diff / scale, rtol))
    return diff <= rtol * scale


def folders_agree(label, cfg, ref_cfg, fields, tensors, ref):
    """The config fields and the tensors (names, dtypes, shapes, bytes) of two folders agree."""
    ok = True
    for key in fields:
        if cfg.get(key) != ref_cfg.get(key):
            print("config.json: %s is %r, the reference has %r" % (key, cfg.get(key), ref_cfg.get(key)))
            ok = False
    if set(tensors) != set(ref):
        print("tensor names differ: missing %s, extra %s" % (sorted(set(ref) - set(tensors)),
                                                              sorted(set(tensors) - set(ref))))
        ok = False
    for n in sorted(set(ref) & set(tensors)):
        a, b = tensors[n], ref[n]
        if a["dtype"] != b["dtype"] or a["shape"] != b["shape"] or a["raw"] != b["raw"]:
            print("tensor %s differs: %s %s vs %s %s" % (n, a["dtype"], a["shape"], b["dtype"], b["shape"]))
            ok = False
    print("%s: %d tensors %s" % (label, len(ref), "identical" if ok else "DIFFER"))
    return ok


def main(argv, doc, check_logits, check_same):
    torch.set_num_threads(1)
    if len(argv) >= 4 and argv[1] == "logits":
        rtol = float(argv[argv.index("--rtol") + 1]) if "--rtol" in argv else 1e-5
        return 0 if check_logits(argv[2], argv[3], rtol) else 1
    if len(argv) == 4 and argv[1] == "same":
        return 0 if check_same(argv[2], argv[3]) else 1
    sys.stderr.write(doc)
    return 2
