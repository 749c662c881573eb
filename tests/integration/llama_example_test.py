#!/usr/bin/python3
"""examples/pretrain_llama3_8b.sh at a tiny size: the script's Llama flags (GQA, RoPE base
500000, RMSNorm, SwiGLU, untied, no biases, bf16, selective recomputation) with 4 layers of
width 64, --mock-data and a NullTokenizer, 8 processes on loopback as TP 2 x PP 2 x DP 2; it
must train (every iteration logged with a finite loss, the loss falling, a checkpoint of the
last iteration). Then the script's full Llama-3-8B size with --dry-run: flags, layout and
memory estimate valid.
usage: llama_example_test.py TESSERA_BINARY SOURCE_DIR"""
import math
import os
import re
import subprocess
import sys
import tempfile
import time

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import ports  # noqa: E402

TESSERA, SOURCE = os.path.abspath(sys.argv[1]), sys.argv[2]
SCRIPT = os.path.join(SOURCE, "examples/pretrain_llama3_8b.sh")
BUDGET_S = 400  # a guard against a hang, not a speed bar (8 processes on a loaded 2-core machine)
ITERS = 8
TINY = {  # the script's size variables, tiny
    "NUM_LAYERS": "4", "HIDDEN_SIZE": "64", "NUM_ATTENTION_HEADS": "4", "NUM_QUERY_GROUPS": "2",
    "FFN_HIDDEN_SIZE": "128", "SEQ_LENGTH": "32", "MAX_POSITION_EMBEDDINGS": "32", "MICRO_BATCH_SIZE": "2",
    "GLOBAL_BATCH_SIZE": "8", "LR": "3e-3", "MIN_LR": "3e-4", "LR_WARMUP_ITERS": "1", "TRAIN_ITERS": str(ITERS),
    "LOG_INTERVAL": "1", "SAVE_INTERVAL": str(ITERS), "EVAL_INTERVAL": str(ITERS), "EVAL_ITERS": "1",
    "TOKENIZER_ARGS": "--tokenizer-type NullTokenizer --vocab-size 255", "DATA_ARGS": "--mock-data",
}
LOSS = re.compile(r" iteration +(\d+)/ +(\d+) \|.* lm loss: (\S+) \|")


def run(tmp, env_update, extra_args, timeout):
    env = {k: v for k, v in os.environ.items() if k not in ("MASTER_ADDR", "MASTER_PORT", "RANK", "WORLD_SIZE",
                                                            "OMP_NUM_THREADS", "GLOO_SOCKET_IFNAME")}
    env.update({"TESSERA": TESSERA, "MASTER_ADDR": "127.0.0.1", "MASTER_PORT": str(ports.claim()),
                "CHECKPOINT_PATH": os.path.join(tmp, "ckpt")})
    env.update(env_update)
    t0 = time.monotonic()
    p = subprocess.run(["bash", SCRIPT] + extra_args, env=env, capture_output=True, text=True, timeout=timeout)
    out = p.stdout + p.stderr
    assert p.returncode == 0, "rc %d\n%s" % (p.returncode, out[-5000:])
    return out, time.monotonic() - t0


def main():
    with tempfile.TemporaryDirectory() as tmp:
        out, elapsed = run(tmp, TINY, [], BUDGET_S)
        losses = [(int(m.group(1)), float(m.group(3))) for m in LOSS.finditer(out)]
        assert [i for i, _ in losses] == list(range(1, ITERS + 1)), out[-4000:]
        assert all(math.isfinite(l) for _, l in losses), losses
        assert losses[-1][1] < losses[0][1] - 0.2, "the loss did not fall: %s" % losses
        assert "world size 8" in out and re.search(r"bf16 \.+ True", out), out[-3000:]
        with open(os.path.join(tmp, "ckpt", "latest_checkpointed_iteration.txt")) as f:
            assert f.read().strip() == str(ITERS)
        print("ok  tiny, 8 processes (TP 2 x PP 2 x DP 2): lm loss %.3f -> %.3f in %.1f s" % (
            losses[0][1], losses[-1][1], elapsed), flush=True)

        full = {"TOKENIZER_ARGS": "--tokenizer-type NullTokenizer --vocab-size 128255", "DATA_ARGS": "--mock-data"}
        out, elapsed = run(tmp, full, ["--dry-run"], 120)
        assert "--dry-run: flags and layout are valid" in out and "Theoretical memory footprints" in out, out[-3000:]
        print("ok  the full Llama-3-8B shape passes --dry-run (%.1f s)" % elapsed, flush=True)


if __name__ == "__main__":
    main()
