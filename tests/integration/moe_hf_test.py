#!/usr/bin/python3
"""Mixture of experts through the `tessera` binary against the float64 transformers reference
(tests/reference/moe_reference.py: a tiny MixtralForCausalLM, post-softmax top-2 of 4 experts,
and a Qwen2MoeForCausalLM with pre-softmax routing and a gated shared expert, each trained 10
iterations with Megatron's optimizer and switch aux loss, coefficient 0.01):
  - `tessera train --init-from-hf` matches every iteration's lm loss (2e-4), grad norm (1e-3) and
    load_balancing_loss (1e-4, relative; float32 against float64) in one process, on each
    DEVICE given (Mixtral; Qwen2-MoE on the CPU); the reference's grad norm without the aux loss is >= 5 % off, so a
    missing or wrong aux gradient fails;
  - `ckpt import-hf` then `ckpt export-hf` gives back every tensor of the folder bit for bit and
    transformers loads the export (llama_hf_check.py same);
  - TP=2 with sequence parallelism, PP=2 and DP=2 with the distributed optimizer match it too;
  - checkpoints (tessera's format): a save at iteration 5 resumes bit for bit in
    --deterministic-mode, and a TP=2 save resumes at TP=1 within the reference's tolerances;
  - the memory estimate is what a Qwen2-MoE run allocates;
  - bad MoE flags exit 2 naming the flag; flags that contradict config.json name the field.
usage: moe_hf_test.py TESSERA_BINARY [DEVICE ...]   (default: cpu strict)"""
import json
import os
import re
import subprocess
import sys
import tempfile
import time

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, HERE)
sys.path.insert(0, os.path.join(os.path.dirname(HERE), "reference"))
import safetensors_io  # noqa: E402
from llama_hf_test import python, tessera  # noqa: E402
from model_parallel_test import env_without_launch, records  # noqa: E402

TESSERA = os.path.abspath(sys.argv[1])
DEVICES = sys.argv[2:] or ["cpu", "strict"]

# float32 against float64 over 10 iterations, relative (as llama_hf_test.py's); the
# load-balancing loss is a mean of softmax probabilities times counts: tighter.
LOSS_RTOL, GRAD_NORM_RTOL, LB_RTOL = 2e-4, 1e-3, 1e-4


def train(tmp, label, args, procs=1):
    path = os.path.join(tmp, label.replace(" ", "_").replace("=", "") + ".jsonl")
    tessera(["train"] + args + ["--log-interval", "1", "--eval-iters", "0", "--log-json", path], procs)
    return records(path)


def compare(expected, got, label, with_lb=True):
    want = {k: safetensors_io.array(expected[k]) for k in ("lm_loss", "grad_norm", "load_balancing_loss")}
    assert [r["iteration"] for r in got] == list(range(1, len(want["lm_loss"]) + 1)), label
    worst = {}
    keys = (("lm_loss", LOSS_RTOL), ("grad_norm", GRAD_NORM_RTOL)) + ((("load_balancing_loss", LB_RTOL),) if with_lb
                                                                        else ())
    for key, rtol in keys:
        for r, w in zip(got, want[key]):
            err = abs(r[key] - w) / abs(w)
            assert err <= rtol, (label, key, r["iteration"], r[key], float(w))
            worst[key] = max(worst.get(key, 0.0), err)
    return ", ".join("%s within %.2g" % kv for kv in worst.items())


def test_training(tmp, ref, family, args, devices):
    expected, _, _ = safetensors_io.read(os.path.join(ref, "expected_train.safetensors"))
    norm, without = (safetensors_io.array(expected[k])[0] for k in ("grad_norm", "grad_norm_without_aux"))
    assert abs(norm - without) / norm > 0.05, "the aux loss must move the first grad norm by >= 5 %%: %g vs %g" % (
        norm, without)
    for device in devices:
        t0 = time.monotonic()
        got = train(tmp, family + " " + device, args + ["--device", device])
        print("ok  %s on %s: %s (%.1f s)" % (family, device, compare(expected, got, family), time.monotonic() - t0),
              flush=True)


# Each layout against the reference, so equal to one process within float32's rounding. Megatron
# logs the last data-parallel rank's own aux losses (track_moe_metrics reduces over the pipeline
# and tensor-parallel ranks, not the replicas), so a DP=2 run's load_balancing_loss is that of its
# half of the batch: not compared there.
LAYOUTS = [
    ("TP=2 SP", ["--tensor-model-parallel-size", "2", "--sequence-parallel"], True),
    ("PP=2", ["--pipeline-model-parallel-size", "2"], True),
    ("DP=2 distributed optimizer", ["--use-distributed-optimizer"], False),
]


def test_layouts(tmp, ref, family, args, layouts):
    expected, _, _ = safetensors_io.read(os.path.join(ref, "expected_train.safetensors"))
    for label, flags, with_lb in layouts:
        t0 = time.monotonic()
        got = train(tmp, family + " " + label, args + flags, procs=2)
        print("ok  %s %s: %s (%.1f s)" % (family, label, compare(expected, got, label, with_lb), time.monotonic() - t0),
              flush=True)


def without_init(args):
    i = args.index("--init-from-hf")
    return args[:i] + args[i + 2:]


def test_checkpoint_resume(tmp, ref, args):
    det = args + ["--deterministic-mode", "--ckpt-format", "tessera", "--save-interval", "5"]
    whole = train(tmp, "det whole", det)
    ckpt = os.path.join(tmp, "ckpt_det")
    train(tmp, "det first half", det + ["--save", ckpt, "--exit-interval", "5"])
    resumed = train(tmp, "det resumed", without_init(det) + ["--load", ckpt])
    assert [r["iteration"] for r in resumed] == list(range(6, 11)), [r["iteration"] for r in resumed]
    keys = ("lm_loss", "grad_norm", "load_balancing_loss")
    assert [[r[k] for k in keys] for r in resumed] == [[r[k] for k in keys] for r in whole[5:]], (resumed, whole[5:])
    print("ok  a save at iteration 5 resumes bit for bit (--deterministic-mode)", flush=True)
    ckpt = os.path.join(tmp, "ckpt_tp2")
    tp2 = ["--tensor-model-parallel-size", "2", "--sequence-parallel"]
    train(tmp, "tp2 first half", det + tp2 + ["--save", ckpt, "--exit-interval", "5"], procs=2)
    resumed = train(tmp, "tp1 resumed", without_init(det) + ["--load", ckpt])
    print("ok  a TP=2 save resumes at TP=1: %s" % compare_tail(ref, resumed), flush=True)


def compare_tail(ref, got):
    """The iterations 6..10 of `got` against the reference's."""
    expected, _, _ = safetensors_io.read(os.path.join(ref, "expected_train.safetensors"))
    worst = {}
    for key, rtol in (("lm_loss", LOSS_RTOL), ("grad_norm", GRAD_NORM_RTOL), ("load_balancing_loss", LB_RTOL)):
        want = safetensors_io.array(expected[key])
        for r in got:
            err = abs(r[key] - want[r["iteration"] - 1]) / abs(want[r["iteration"] - 1])
            assert err <= rtol, (key, r["iteration"], r[key], float(want[r["iteration"] - 1]))
            worst[key] = max(worst.get(key, 0.0), err)
    return ", ".join("%s within %.2g" % kv for kv in worst.items())


def test_memory_estimate(args):
    """The estimate (the model's own slab layout, with the experts' permuted buffers and the
    shared experts') is what an MoE run allocates."""
    p = subprocess.run([TESSERA, "train"] + args + ["--train-iters", "1", "--eval-iters", "0"], capture_output=True,
                       text=True, timeout=240, env=env_without_launch())
    assert p.returncode == 0, p.stderr[-3000:]
    estimate = float(re.search(r"Theoretical memory footprints: .* total=([\d.]+) MB", p.stdout).group(1))
    measured = [float(x) for x in re.findall(r"max allocated: ([\d.]+)", p.stdout)]
    assert measured and all(estimate <= m <= estimate * 1.01 for m in measured), (estimate, measured)
    print("ok  Qwen2-MoE: estimate %.2f MB, max allocated %s MB" % (estimate, measured), flush=True)


def test_round_trip(tmp, ref, family):
    ckpt, out = os.path.join(tmp, family + "_imported"), os.path.join(tmp, family + "_exported")
    p = tessera(["ckpt", "import-hf", os.path.join(ref, "hf"), ckpt])
    assert "--num-experts 4" in p.stdout, p.stdout
    tessera(["ckpt", "export-hf", ckpt, out])
    print(python("llama_hf_check.py", "same", out, os.path.join(ref, "hf")).strip(), flush=True)
    print("ok  %s: import-hf then export-hf gives back the folder" % family, flush=True)


def with_flag(args, flag, value=None):
    """args with `flag` set to `value` (appended, or replacing its value); value None: a switch."""
    if flag in args:
        i = args.index(flag)
        return args[:i + 1] + [value] + args[i + 2:]
    return args + [flag] + ([value] if value is not None else [])


def test_flag_errors(args):
    def usage_error(flags, needles):
        p = tessera(["train"] + flags + ["--train-iters", "1"], expect_rc=2)
        assert all(n in p.stderr for n in needles), (needles, p.stderr[-2000:])

    usage_error(with_flag(args, "--moe-router-topk", "5"), ["--moe-router-topk 5 is larger than --num-experts 4"])
    usage_error(with_flag(args, "--moe-router-topk", "1"), ["--moe-router-topk 1 needs --moe-router-pre-softmax"])
    usage_error(with_flag(args, "--expert-model-parallel-size", "3"),
                ["--num-experts 4 is not divisible by --expert-model-parallel-size 3"])
    usage_error(with_flag(args, "--expert-tensor-parallel-size", "2"),
                ["--expert-tensor-parallel-size 2 differs from --tensor-model-parallel-size 1",
                 "leave --expert-tensor-parallel-size unset"])
    usage_error(with_flag(args, "--moe-expert-capacity-factor", "1.0"),
                ["--moe-expert-capacity-factor only works with --moe-token-dispatcher-type alltoall"])
    usage_error(with_flag(args, "--moe-pad-expert-input-to-capacity"), ["needs --moe-expert-capacity-factor"])
    usage_error(with_flag(args, "--moe-router-load-balancing-type", "sinkhorn"), ["--moe-router-load-balancing-type sinkhorn", "not support yet"])
    usage_error(with_flag(args, "--moe-input-jitter-eps", "0.01"), ["--moe-input-jitter-eps is a Megatron-LM flag that tessera does not support yet"])
    # config.json's experts against the flags: the field and the flag.
    usage_error(with_flag(with_flag(args, "--moe-router-topk", "1"), "--moe-router-pre-softmax"),
                ["num_experts_per_tok is 2", "--moe-router-topk"])
    usage_error(with_flag(args, "--moe-ffn-hidden-size", "32"), ["intermediate_size is 64", "--moe-ffn-hidden-size"])
    # MoE with tensor parallelism needs sequence parallelism (two processes: TP 2).
    env_args = [a for a in args if a != "--sequence-parallel"] + ["--tensor-model-parallel-size", "2"]
    p = subprocess.run([TESSERA, "launch", "--standalone", "--nproc_per_node", "2", "train"] + env_args +
                       ["--train-iters", "1"], capture_output=True, text=True, timeout=120, env=env_without_launch())
    assert p.returncode != 0 and "needs --sequence-parallel" in p.stdout + p.stderr, (p.returncode, p.stderr[-2000:])
    print("ok  bad MoE flags exit 2 naming the flag; mismatches name the config.json field", flush=True)


def main():
    with tempfile.TemporaryDirectory() as tmp:
        for family in ("mixtral", "qwen2_moe"):
            ref = os.path.join(tmp, family)
            print(python("moe_reference.py", "--out", ref, "--family", family).strip()[-300:], flush=True)
            args = json.load(open(os.path.join(ref, "train_config.json")))["megatron_args"]
            if family == "mixtral":
                test_flag_errors(args)
            test_round_trip(tmp, ref, family)
            test_training(tmp, ref, family, args, DEVICES if family == "mixtral" else ["cpu"])
            # Qwen2-MoE's shared experts and their gate under TP (the gate's gradient sums over it).
            test_layouts(tmp, ref, family, args, LAYOUTS if family == "mixtral" else LAYOUTS[:1])
            if family == "mixtral":
                test_checkpoint_resume(tmp, ref, args)
            else:
                test_memory_estimate(args)


if __name__ == "__main__":
    main()
