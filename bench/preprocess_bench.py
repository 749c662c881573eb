#!/usr/bin/env python3
"""Benchmark: `tessera preprocess` against the Python implementation of the same work
(tests/reference/data/preprocess_ref.py: Megatron's preprocess_data.py with GPT-2 BPE on
python3-regex), side by side in one run, for 1 and 2 workers, on tinyshakespeare (as JSONL,
one paragraph per line) and the two Alpaca JSON arrays (with --text-template).

  /usr/bin/python3 bench/preprocess_bench.py [--tessera build/src/tessera/cli/tessera]
                                             [--repeat 3] [--scale 1] [--markdown]

Figures: "proc" is the processing time each implementation reports (after its startup --
vocabulary load, worker start -- until the last document is written), "wall" the whole
process. MB/s is input bytes / proc time, tokens/s is GPT-2 tokens / proc time; each figure is
the best of --repeat runs. "x python" compares MB/s at the same worker count; the bar is 20x.
Both write byte-identical outputs (checked). Prints figures; never fails a build.
"""
import argparse
import json
import os
import re
import subprocess
import sys
import tempfile
import time

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(HERE)
DATA = os.path.join(ROOT, "tests", "data")
REF = os.path.join(ROOT, "tests", "reference", "data", "preprocess_ref.py")
GPT2 = ["--tokenizer-type", "GPT2BPETokenizer", "--vocab-file", os.path.join(DATA, "gpt2", "vocab.json"),
        "--merge-file", os.path.join(DATA, "gpt2", "merges.txt")]
TEMPLATE = r"{instruction}\n{input}\n{output}"


def make_corpora(work, scale):
    with open(os.path.join(DATA, "corpora", "tinyshakespeare.txt"), encoding="utf-8") as f:
        paragraphs = f.read().split("\n\n")
    ts = os.path.join(work, "tinyshakespeare.jsonl")
    with open(ts, "w", encoding="utf-8") as f:
        for _ in range(scale):
            for p in paragraphs:
                f.write(json.dumps({"text": p}) + "\n")
    corpora = [("tinyshakespeare (JSONL)", ts, [])]
    for name in ("alpaca_self_instruct_seed", "alpaca_gsm8k_test"):
        src = os.path.join(DATA, "corpora", name + ".json")
        path = src
        if scale > 1:
            with open(src, encoding="utf-8") as f:
                records = json.load(f)
            path = os.path.join(work, name + ".json")
            with open(path, "w", encoding="utf-8") as f:
                json.dump(records * scale, f, ensure_ascii=False, indent=1)
        corpora.append((name + " (JSON)", path, ["--text-template", TEMPLATE]))
    return corpora


def run(cmd):
    t = time.time()
    p = subprocess.run(cmd, capture_output=True, text=True)
    wall = time.time() - t
    if p.returncode != 0:
        sys.exit(f"failed: {' '.join(cmd)}\n{p.stdout}\n{p.stderr}")
    return p.stdout, wall


def run_tessera(tessera, path, flags, workers, prefix):
    out, wall = run([tessera, "preprocess", "--input", path, "--output-prefix", prefix, *GPT2, "--workers",
                     str(workers), "--append-eod", "--log-interval", "100000000", "--no-progress-bar", *flags])
    proc = float(re.search(r"in ([0-9.]+) s", out).group(1))
    tokens = sum(int(m) for m in re.findall(r"sequences, (\d+) tokens", out))
    docs = int(re.search(r"Done: (\d+) documents", out).group(1))
    return dict(proc=proc, wall=wall, tokens=tokens, docs=docs)


def run_python(path, flags, workers, prefix):
    out, wall = run([sys.executable, REF, "--input", path, "--output-prefix", prefix, *GPT2, "--workers",
                     str(workers), "--append-eod", "--log-interval", "100000000", *flags])
    m = re.search(r"summary documents=(\d+) tokens=(\d+) seconds=([0-9.]+)", out)
    return dict(proc=float(m.group(3)), wall=wall, tokens=int(m.group(2)), docs=int(m.group(1)))


def best(runs):
    return dict(runs[0], proc=min(r["proc"] for r in runs), wall=min(r["wall"] for r in runs))


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--tessera", default=os.path.join(ROOT, "build", "src", "tessera", "cli", "tessera"))
    ap.add_argument("--repeat", type=int, default=3)
    ap.add_argument("--scale", type=int, default=1, help="repeat each corpus this many times")
    ap.add_argument("--markdown", action="store_true", help="print a Markdown table too")
    args = ap.parse_args()
    rows = []
    with tempfile.TemporaryDirectory(prefix="preprocess_bench_") as work:
        for name, path, flags in make_corpora(work, args.scale):
            size = os.path.getsize(path)
            for workers in (1, 2):
                t = best([run_tessera(args.tessera, path, flags, workers, os.path.join(work, "t"))
                          for _ in range(args.repeat)])
                p = best([run_python(path, flags, workers, os.path.join(work, "p")) for _ in range(args.repeat)])
                for ext in (".bin", ".idx"):
                    with open(os.path.join(work, "t_text_document" + ext), "rb") as a, \
                            open(os.path.join(work, "p_text_document" + ext), "rb") as b:
                        if a.read() != b.read():
                            sys.exit(f"outputs differ for {name} ({ext})")
                for impl, r in (("tessera", t), ("python", p)):
                    rows.append(dict(corpus=name, impl=impl, workers=workers, mb=size / 1e6, docs=r["docs"],
                                     tokens=r["tokens"], proc=r["proc"], wall=r["wall"],
                                     mbs=size / 1e6 / r["proc"], tps=r["tokens"] / r["proc"],
                                     speedup=p["proc"] / r["proc"] if impl == "tessera" else 1.0))
    head = f"{'corpus':34} {'impl':8} {'wk':>2} {'MB':>6} {'docs':>6} {'tokens':>8} {'proc s':>8} " \
           f"{'MB/s':>8} {'tokens/s':>10} {'wall s':>7} {'x python':>8}"
    print(head)
    print("-" * len(head))
    for r in rows:
        print(f"{r['corpus']:34} {r['impl']:8} {r['workers']:>2} {r['mb']:6.2f} {r['docs']:6d} {r['tokens']:8d} "
              f"{r['proc']:8.4f} {r['mbs']:8.2f} {r['tps']:10.0f} {r['wall']:7.2f} "
              f"{(str(round(r['speedup'])) + 'x') if r['impl'] == 'tessera' else '':>8}")
    if args.markdown:
        print("\n| corpus | impl | workers | input MB | tokens | proc s | MB/s | tokens/s | wall s | × python |")
        print("| --- | --- | ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: |")
        for r in rows:
            sp = f"{r['speedup']:.0f}×" if r["impl"] == "tessera" else ""
            print(f"| {r['corpus']} | {r['impl']} | {r['workers']} | {r['mb']:.2f} | {r['tokens']} | "
                  f"{r['proc']:.4f} | {r['mbs']:.2f} | {r['tps']:,.0f} | {r['wall']:.2f} | {sp} |")


if __name__ == "__main__":
    main()
