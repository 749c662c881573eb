#!/usr/bin/env python3
"""Benchmark: `tessera preprocess` against the Python implementation of the same work
(tests/reference/data/preprocess_ref.py: Megatron's preprocess_data.py with GPT-2 BPE on
python3-regex) and, with --megatron, against Megatron's own tools/preprocess_data.py, side by
side in one run, for 1 and 2 workers, on tinyshakespeare (as JSONL, one paragraph per line) and
the two Alpaca JSON arrays (with --text-template; Megatron's script reads JSONL only).

  /usr/bin/python3 bench/preprocess_bench.py [--tessera build/src/tessera/cli/tessera]
      [--repeat 3] [--scale 1] [--corpora tinyshakespeare ...] [--workers 1 2] [--markdown]
      [--megatron MEGATRON_LM_CHECKOUT [--megatron-python PYTHON]]

--megatron takes a checkout of NVIDIA/Megatron-LM core_r0.10.0 (it needs tools/ and
megatron/), run by a Python with torch, numpy, regex, six and packaging (by default the tools
venv's, $TESSERA_TOOLS_VENV or /opt/tessera/tools-venv).

Figures: "proc" is the processing time each implementation reports (after its startup --
vocabulary load, worker start -- until the last document is written; for Megatron's script,
its progress line after the last document, whose clock starts before its workers have loaded
their tokenizer), "wall" the whole process. MB/s is input bytes (10^6) / proc time, tokens/s is
GPT-2 tokens / proc time. Each round runs every implementation once, one right after the
other, so that a ratio compares runs made under the same machine load; a figure is the median
over --repeat rounds, and "x python" / "x megatron" are the medians of the rounds' proc-time
ratios at the same number of workers (the bars, per worker: 20x the Python implementation, 25x
Megatron's script). All write byte-identical outputs (checked). Prints figures; never fails a
build.
"""
import argparse
import json
import os
import re
import statistics
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
CORPORA = ["tinyshakespeare", "alpaca_self_instruct_seed", "alpaca_gsm8k_test"]


def make_corpora(work, scale, names):
    """(label, path, extra flags, number of JSONL documents or None) for each corpus named."""
    corpora = []
    if "tinyshakespeare" in names:
        with open(os.path.join(DATA, "corpora", "tinyshakespeare.txt"), encoding="utf-8") as f:
            paragraphs = f.read().split("\n\n")
        ts = os.path.join(work, "tinyshakespeare.jsonl")
        with open(ts, "w", encoding="utf-8") as f:
            for _ in range(scale):
                for p in paragraphs:
                    f.write(json.dumps({"text": p}) + "\n")
        corpora.append(("tinyshakespeare (JSONL)", ts, [], len(paragraphs) * scale))
    for name in CORPORA[1:]:
        if name not in names:
            continue
        src = os.path.join(DATA, "corpora", name + ".json")
        path = src
        if scale > 1:
            with open(src, encoding="utf-8") as f:
                records = json.load(f)
            path = os.path.join(work, name + ".json")
            with open(path, "w", encoding="utf-8") as f:
                json.dump(records * scale, f, ensure_ascii=False, indent=1)
        corpora.append((name + " (JSON)", path, ["--text-template", TEMPLATE], None))
    return corpora


def run(cmd, env=None):
    t = time.time()
    p = subprocess.run(cmd, capture_output=True, text=True, env=env)
    wall = time.time() - t
    if p.returncode != 0:
        sys.exit(f"failed: {' '.join(cmd)}\n{p.stdout}\n{p.stderr}")
    return p, wall


def run_tessera(tessera, path, flags, workers, prefix):
    p, wall = run([tessera, "preprocess", "--input", path, "--output-prefix", prefix, *GPT2, "--workers",
                   str(workers), "--append-eod", "--log-interval", "100000000", "--no-progress-bar", *flags])
    proc = float(re.search(r"in ([0-9.]+) s", p.stdout).group(1))
    tokens = sum(int(m) for m in re.findall(r"sequences, (\d+) tokens", p.stdout))
    docs = int(re.search(r"Done: (\d+) documents", p.stdout).group(1))
    return dict(proc=proc, wall=wall, tokens=tokens, docs=docs)


def run_python(path, flags, workers, prefix):
    p, wall = run([sys.executable, REF, "--input", path, "--output-prefix", prefix, *GPT2, "--workers",
                   str(workers), "--append-eod", "--log-interval", "100000000", *flags])
    m = re.search(r"summary documents=(\d+) tokens=(\d+) seconds=([0-9.]+)", p.stdout)
    return dict(proc=float(m.group(3)), wall=wall, tokens=int(m.group(2)), docs=int(m.group(1)))


def run_megatron(checkout, python, path, docs, workers, prefix):
    # --log-interval docs: one progress line, after the last document; its docs/s gives the time.
    p, wall = run([python, os.path.join(checkout, "tools", "preprocess_data.py"), "--input", path, "--output-prefix",
                   prefix, *GPT2, "--workers", str(workers), "--append-eod", "--log-interval", str(docs)],
                  env=dict(os.environ, PYTHONPATH=checkout))
    m = re.search(r"Processed (\d+) documents \(([0-9.e+-]+) docs/s", p.stderr)
    if not m or int(m.group(1)) != docs:
        sys.exit(f"no progress line after document {docs} from Megatron's preprocess_data.py\n{p.stderr}")
    return dict(proc=docs / float(m.group(2)), wall=wall, docs=docs)


def same_outputs(work, a, b):
    for ext in (".bin", ".idx"):
        with open(os.path.join(work, a + "_text_document" + ext), "rb") as fa, \
                open(os.path.join(work, b + "_text_document" + ext), "rb") as fb:
            if fa.read() != fb.read():
                return False
    return True


def measure(impls, workers, repeat, work, name):
    """Rounds of every implementation in turn; the runs of each, by implementation."""
    runs = {impl: [] for impl, _, _ in impls}
    for _ in range(repeat):
        for impl, prefix, fn in impls:
            runs[impl].append(fn(workers, os.path.join(work, prefix)))
            if prefix != "t" and not same_outputs(work, "t", prefix):
                sys.exit(f"outputs differ for {name}: tessera and {impl}")
    return runs


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--tessera", default=os.path.join(ROOT, "build", "src", "tessera", "cli", "tessera"))
    ap.add_argument("--repeat", type=int, default=3, help="rounds; each figure is their median")
    ap.add_argument("--scale", type=int, default=1, help="repeat each corpus this many times")
    ap.add_argument("--corpora", nargs="+", choices=CORPORA, default=CORPORA)
    ap.add_argument("--workers", nargs="+", type=int, default=[1, 2])
    ap.add_argument("--megatron", help="a Megatron-LM core_r0.10.0 checkout: run its tools/preprocess_data.py too")
    ap.add_argument("--megatron-python", default=os.path.join(
        os.environ.get("TESSERA_TOOLS_VENV", "/opt/tessera/tools-venv"), "bin", "python"))
    ap.add_argument("--markdown", action="store_true", help="print a Markdown table too")
    args = ap.parse_args()
    peers = ["python"] + (["megatron"] if args.megatron else [])
    rows = []
    with tempfile.TemporaryDirectory(prefix="preprocess_bench_") as work:
        for name, path, flags, jsonl_docs in make_corpora(work, args.scale, args.corpora):
            size = os.path.getsize(path)
            impls = [("tessera", "t", lambda w, out: run_tessera(args.tessera, path, flags, w, out)),
                     ("python", "p", lambda w, out: run_python(path, flags, w, out))]
            if args.megatron and jsonl_docs:
                impls.append(("megatron", "m", lambda w, out: run_megatron(args.megatron, args.megatron_python, path,
                                                                            jsonl_docs, w, out)))
            for workers in args.workers:
                runs = measure(impls, workers, args.repeat, work, name)
                tokens = runs["tessera"][0]["tokens"]
                for impl, _, _ in impls:
                    proc = statistics.median(r["proc"] for r in runs[impl])
                    ratio = {peer: statistics.median(p["proc"] / t["proc"] for p, t in zip(runs[peer], runs[impl]))
                             for peer in peers if impl == "tessera" and peer in runs}
                    rows.append(dict(corpus=name, impl=impl, workers=workers, mb=size / 1e6, docs=runs[impl][0]["docs"],
                                     tokens=tokens, proc=proc, wall=statistics.median(r["wall"] for r in runs[impl]),
                                     mbs=size / 1e6 / proc, tps=tokens / proc, ratio=ratio))

    def ratio(r, peer, x="x"):
        return f"{r['ratio'][peer]:.1f}{x}" if peer in r["ratio"] else ""

    head = f"{'corpus':34} {'impl':8} {'wk':>2} {'MB':>6} {'docs':>6} {'tokens':>8} {'proc s':>8} " \
           f"{'MB/s':>8} {'tokens/s':>10} {'wall s':>7}" + "".join(f" {'x ' + peer:>10}" for peer in peers)
    print(head)
    print("-" * len(head))
    for r in rows:
        print(f"{r['corpus']:34} {r['impl']:8} {r['workers']:>2} {r['mb']:6.2f} {r['docs']:6d} {r['tokens']:8d} "
              f"{r['proc']:8.4f} {r['mbs']:8.2f} {r['tps']:10.0f} {r['wall']:7.2f}" +
              "".join(f" {ratio(r, peer):>10}" for peer in peers))
    if args.markdown:
        print("\n| corpus | impl | workers | input MB | tokens | proc s | MB/s | tokens/s | wall s |" +
              "".join(f" × {peer} |" for peer in peers))
        print("| --- | --- | ---: | ---: | ---: | ---: | ---: | ---: | ---: |" + " ---: |" * len(peers))
        for r in rows:
            print(f"| {r['corpus']} | {r['impl']} | {r['workers']} | {r['mb']:.2f} | {r['tokens']} | "
                  f"{r['proc']:.4f} | {r['mbs']:.2f} | {r['tps']:,.0f} | {r['wall']:.2f} |" +
                  "".join(f" {ratio(r, peer, '×')} |" for peer in peers))


if __name__ == "__main__":
    main()
