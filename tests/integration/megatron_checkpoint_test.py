"""Megatron-LM's own checkpoint format (--ckpt-format torch) through `tessera train` and
`tessera ckpt`, read back with PyTorch's torch.load (Megatron's enums from
tests/reference/megatron_stub; Megatron-LM itself is not needed):

- save: a run saved with --ckpt-format torch holds Megatron's layout and keys, checkpoint_version
  3.0, the iteration, a complete args Namespace (Megatron's fields, the run's values, consumed
  samples, params_dtype, model_type), model tensors bit-equal to the same run's tessera-format
  save, Adam's moments under Megatron's two parameter groups equal to tessera's, and
  opt_param_scheduler's num_steps, rng_state as Megatron's seeding leaves each rank's
  generators (restored with random/numpy/torch's own setters), none with --no-save-rng; a --bf16 TP=2 PP=2 run saves bf16 model tensors (each the
  rounding of its fp32 parameter) and the fp32 parameters as fp32_from_fp16_params;
- resume: 3 iterations + save (torch format) + resume to 6 gives the log records (loss, grad
  norm, learning rate, consumed samples) of 6 straight iterations bit for bit, in one process
  (fp32) and in TP=2 PP=2 (--bf16, 4 processes);
- convert: the torch checkpoint converted to tessera's format at TP=2 exports (export-hf) the
  same bytes as the run's own tessera save; converted back to torch at TP=1 its model tensors
  are the original's;
- Llama: a TP=2 save holds each rank's [gate_r; up_r] fc1 and query group's QKV rows as
  Megatron lays them out; made a converter-style release checkpoint it trains on as --finetune;
- streaming: a save adds less than its file's size to the run's peak memory;
- interleaved pipelines: PP=4 x 2 virtual stages saves model0/model1 per file (Megatron's
  numbering), resumes bit-exactly and loads into one process;
- the distributed optimizer (DP=2 with one bucket, with buckets of 1000 elements, in bf16, and
  PP=2 x DP=2): distrib_optim.pt holds Megatron's structure (buckets_coalesced, buffer 0 keyed
  by the dtype pair, flat fp32 param / exp_avg / exp_avg_sq of numel_unpadded), laid out as
  the fact sheet's rules computed here independently (reverse order, 64-element starts,
  buckets closed after the parameter that fills them, the shared embedding of PP=2 in a bucket
  of its own, each cut to numel_unpadded, zeros between parameters): `param` rounds to the
  model's weights at each parameter's offset; model_optim_rng.pt's optimizer holds only the
  groups (with step, without params); each run resumes bit-exactly in its layout, the PP=2
  save within 1e-5 in one process, and the one-bucket save within 1e-5 at DP=4 with the flag
  and in one process without it;
- the distributed optimizer of an MoE run at EP=2: each EP rank's distrib_optim.pt is
  ChainedOptimizer.save_parameter_state's list [dense, expert] (None for the dense optimizer on
  EP rank 1), each laid out by the same rules over its own parameters and DP group, and the
  optimizer dict is the list of both optimizers' groups (is_expert_parallel); it resumes bit
  for bit at EP=2 and within 1e-5 in one process;
- hostile files: a pickle whose __reduce__ would run os.system, an unknown global, a truncated
  zip and a tensor whose storage is too short are each an error (exit 1) naming the file, from
  `ckpt inspect` or `train --load`, and nothing is executed; so is a damaged distrib_optim.pt
  when the optimizer is loaded.
usage: megatron_checkpoint_test.py TESSERA_BINARY"""
import argparse
import datetime
import json
import math
import os
import random
import shutil
import struct
import subprocess
import sys
import tempfile
import zipfile

import numpy
import torch

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, os.path.join(HERE, "..", "reference", "megatron_stub"))
from megatron.core.enums import ModelType  # noqa: E402
from megatron.core.rerun_state_machine import RerunMode, RerunState  # noqa: E402

TESSERA = os.path.abspath(sys.argv[1])
MODEL = ["--ckpt-format", "tessera",
         "--num-layers", "2", "--hidden-size", "32", "--num-attention-heads", "4", "--seq-length", "16",
         "--max-position-embeddings", "16", "--tokenizer-type", "NullTokenizer", "--vocab-size", "60",
         "--make-vocab-size-divisible-by", "16"]
TRAIN = MODEL + ["--micro-batch-size", "1", "--global-batch-size", "4", "--mock-data", "--lr", "1e-3",
                 "--lr-decay-style", "cosine", "--lr-warmup-iters", "1", "--train-iters", "6", "--log-interval", "1",
                 "--eval-iters", "0", "--weight-decay", "0.1"]


def env():
    e = {k: v for k, v in os.environ.items() if k not in ("MASTER_ADDR", "MASTER_PORT", "RANK", "WORLD_SIZE")}
    e["OMP_NUM_THREADS"] = "1"
    return e


def run(flags, procs=1, expect_rc=0, cmd="train"):
    prefix = [TESSERA, cmd] if procs == 1 else [TESSERA, "launch", "--standalone", "--nproc_per_node", str(procs), cmd]
    p = subprocess.run(prefix + flags, capture_output=True, text=True, timeout=180, env=env())
    assert p.returncode == expect_rc, "rc %d (want %d): %s\n%s\n%s" % (p.returncode, expect_rc, " ".join(flags),
                                                                      p.stdout[-3000:], p.stderr[-3000:])
    return p


def records(path):
    return [json.loads(l) for l in open(path)]


def same_records(a, b, label):
    keys = ("iteration", "consumed_samples", "lm_loss", "grad_norm", "learning_rate")
    assert [[r[k] for k in keys] for r in a] == [[r[k] for k in keys] for r in b], (label, a, b)


def close_records(a, b, label, rtol=1e-5):
    assert [r["iteration"] for r in a] == [r["iteration"] for r in b], (label, a, b)
    for x, y in zip(a, b):
        for k in ("lm_loss", "grad_norm"):
            assert abs(x[k] - y[k]) <= rtol * abs(y[k]), (label, k, x, y)


def with_flag(flags, name, value):
    i = flags.index(name)
    return flags[:i + 1] + [value] + flags[i + 2:]


def check_interleaved(tmp):
    """PP=4 with 2 virtual stages: each file holds model0 and model1, each chunk's layers from 0
    (chunk v of stage p is virtual stage 4v + p: one layer each here), args record the virtual
    stages; the run resumes bit-exactly, and one process loading it continues within 1e-5."""
    one = with_flag(TRAIN, "--num-layers", "8")
    vp = one + ["--pipeline-model-parallel-size", "4", "--num-layers-per-virtual-pipeline-stage", "1"]
    run(vp + ["--log-json", f"{tmp}/vp_full.jsonl"], procs=4)
    run(vp + ["--save", f"{tmp}/mtvp", "--save-interval", "3", "--exit-interval", "3", "--ckpt-format", "torch"],
        procs=4)
    files = [torch.load(f"{tmp}/mtvp/iter_0000003/mp_rank_00_{p:03d}/model_optim_rng.pt") for p in range(4)]
    for p, sd in enumerate(files):
        assert "model" not in sd and [k for k in sd if k.startswith("model")] == ["model0", "model1"], (p, list(sd))
        assert sd["args"].virtual_pipeline_model_parallel_size == 2
        for chunk in ("model0", "model1"):
            layers = {k.split(".")[2] for k in sd[chunk] if k.startswith("decoder.layers.")}
            assert layers == {"0"}, (p, chunk, layers)
    assert "embedding.word_embeddings.weight" in files[0]["model0"]
    assert "embedding.word_embeddings.weight" not in files[0]["model1"]
    assert "decoder.final_layernorm.weight" in files[3]["model1"] and "output_layer._extra_state" in files[3]["model1"]
    assert "decoder.final_layernorm.weight" not in files[3]["model0"]
    # The optimizer numbers the parameters through both chunks (model0's first).
    n = sum(v is not None for v in files[1]["model0"].values()) + sum(v is not None for v in files[1]["model1"].values())
    assert sorted(i for g in files[1]["optimizer"]["param_groups"] for i in g["params"]) == list(range(n))
    run(vp + ["--load", f"{tmp}/mtvp", "--log-json", f"{tmp}/vp_resumed.jsonl"], procs=4)
    full = records(f"{tmp}/vp_full.jsonl")
    same_records(full[3:], records(f"{tmp}/vp_resumed.jsonl"), "interleaved resume")
    run(one + ["--load", f"{tmp}/mtvp", "--log-json", f"{tmp}/vp_one.jsonl"])
    close_records(records(f"{tmp}/vp_one.jsonl"), full[3:], "interleaved checkpoint in one process")


LLAMA = ["--group-query-attention", "--num-query-groups", "2", "--swiglu", "--normalization", "RMSNorm",
         "--position-embedding-type", "rope", "--disable-bias-linear", "--untie-embeddings-and-output-weights",
         "--ffn-hidden-size", "64"]


def check_llama(tmp):
    """A Llama run (GQA 4 heads in 2 groups, SwiGLU, untied) at TP=2 saved with --ckpt-format
    torch: each rank's linear_fc1 is Megatron's [gate_r; up_r] [2F/TP, H] and linear_qkv its
    query group's rows [(NH/NG + 2) * hd, H], equal to the same run's tessera save (fc1
    [2, F/TP, H]). Made a converter-style release checkpoint (tracker "release", folder
    release/, no optimizer or RNG, nothing consumed), --load starts it at iteration 0 with
    fresh optimizer state: the records of --finetune from the original; ckpt inspect, export-hf
    (the original's bytes) and convert (to iteration 0) read it."""
    llama = TRAIN + LLAMA + ["--tensor-model-parallel-size", "2", "--exit-interval", "2", "--save-interval", "2"]
    run(llama + ["--save", f"{tmp}/ll_ts"], procs=2)
    run(llama + ["--save", f"{tmp}/ll_mt", "--ckpt-format", "torch"], procs=2)
    H, F, hd = 32, 64, 8
    for r in range(2):
        sd = torch.load(f"{tmp}/ll_mt/iter_0000002/mp_rank_{r:02d}/model_optim_rng.pt")
        ts = safetensors_tensors(f"{tmp}/ll_ts/iter_0000002/mp_rank_{r:02d}/model.safetensors")
        assert sd["args"].swiglu and sd["args"].num_query_groups == 2 and sd["args"].normalization == "RMSNorm"
        for layer in range(2):
            p = "decoder.layers.%d." % layer
            fc1, qkv = sd["model"][p + "mlp.linear_fc1.weight"], sd["model"][p + "self_attention.linear_qkv.weight"]
            assert tuple(fc1.shape) == (2 * F // 2, H) and tuple(qkv.shape) == ((2 + 2) * hd, H), (fc1.shape, qkv.shape)
            # tessera's [2, F/TP, H] in row-major order is [gate_r; up_r].
            assert raw(fc1) == ts[p + "mlp.linear_fc1.weight"], (r, layer)
            assert raw(qkv) == ts[p + "self_attention.linear_qkv.weight"], (r, layer)
        assert "output_layer.weight" in sd["model"] and not any(k.endswith(".bias") for k in sd["model"])
    release = f"{tmp}/ll_release"
    for r in range(2):
        sd = torch.load(f"{tmp}/ll_mt/iter_0000002/mp_rank_{r:02d}/model_optim_rng.pt")
        for k in ("optimizer", "opt_param_scheduler", "rng_state"):
            del sd[k]
        sd["args"].consumed_train_samples = 0
        os.makedirs(f"{release}/release/mp_rank_{r:02d}")
        torch.save(sd, f"{release}/release/mp_rank_{r:02d}/model_optim_rng.pt")
    with open(f"{release}/latest_checkpointed_iteration.txt", "w") as f:
        f.write("release\n")
    train = with_flag(llama, "--exit-interval", "6")
    out = run(train + ["--load", release, "--log-json", f"{tmp}/ll_release.jsonl"], procs=2).stdout
    assert "at iteration 0 (Megatron-LM's release checkpoint)" in out, out[-2000:]
    run(train + ["--load", f"{tmp}/ll_mt", "--finetune", "--log-json", f"{tmp}/ll_finetune.jsonl"], procs=2)
    got = records(f"{tmp}/ll_release.jsonl")
    assert got[0]["iteration"] == 1 and len(got) == 6, got
    same_records(got, records(f"{tmp}/ll_finetune.jsonl"), "release checkpoint against --finetune")
    inspect = run(["inspect", release], cmd="ckpt").stdout
    assert "Megatron-LM torch" in inspect and "iteration: 0 (release checkpoint: the model alone)" in inspect, inspect
    # export-hf and convert read it too: the same weights as the iteration it was made from.
    run(["export-hf", release, f"{tmp}/ll_release_hf"], cmd="ckpt")
    run(["export-hf", f"{tmp}/ll_mt", f"{tmp}/ll_mt_hf"], cmd="ckpt")
    assert open(f"{tmp}/ll_release_hf/model.safetensors", "rb").read() == open(f"{tmp}/ll_mt_hf/model.safetensors",
                                                                                "rb").read()
    run(["convert", release, f"{tmp}/ll_release_ts", "--to", "tessera"], cmd="ckpt")
    assert open(f"{tmp}/ll_release_ts/latest_checkpointed_iteration.txt").read() == "0"


def peak_rss_bytes(flags):
    """The peak resident memory of `tessera train FLAGS` (its own rusage, from wait4)."""
    p = subprocess.Popen([TESSERA, "train"] + flags, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, env=env())
    _, status, usage = os.wait4(p.pid, 0)
    assert os.waitstatus_to_exitcode(status) == 0, p.stderr.read()[-3000:]
    return usage.ru_maxrss * 1024


def check_streamed_save(tmp):
    """model_optim_rng.pt is streamed one tensor at a time: the save adds less than the file's
    size to the run's peak memory (a whole-file writer adds about three times it)."""
    big = with_flag(with_flag(with_flag(TRAIN, "--hidden-size", "256"), "--vocab-size", "32000"), "--train-iters", "2")
    big += ["--exit-interval", "1"]
    plain = peak_rss_bytes(big)
    saved = peak_rss_bytes(big + ["--save", f"{tmp}/rss", "--save-interval", "1", "--ckpt-format", "torch"])
    size = os.path.getsize(f"{tmp}/rss/iter_0000001/mp_rank_00/model_optim_rng.pt")
    assert saved - plain < size, (plain, saved, size)
    return plain, saved, size


def distrib_optim_layout(model, dp, bucket_size, shared):
    """Megatron's buffer layout of one rank (fact sheet 13.1), independently of tessera: each
    parameter's offset in distrib_optim.pt's flat tensors, and numel_unpadded. `shared`: the
    shared embedding's names, each in a bucket of its own."""
    params = [(k, v.numel()) for k, v in model.items() if v is not None and not k.endswith("_extra_state")]
    align = dp * 128 // math.gcd(dp, 128)
    offsets, buckets, start, bucket_start = {}, [], 0, 0

    def close(end):
        nonlocal start, bucket_start
        buckets.append((bucket_start, end))
        bucket_start = start = (end + align - 1) // align * align

    for i, (name, n) in enumerate(reversed(params)):
        start = (start + 63) // 64 * 64
        if name in shared and start > bucket_start:
            close(start)  # the open bucket ends where the shared embedding would start
        offsets[name] = start
        start += n
        if name in shared or start - bucket_start >= bucket_size or i == len(params) - 1:
            close(start)
    # The file cuts each bucket to its numel_unpadded: shift by the padding dropped before it.
    dropped, shift = 0, {}
    for b, (lo, hi) in enumerate(buckets):
        shift[b] = dropped
        dropped += (buckets[b + 1][0] if b + 1 < len(buckets) else hi) - hi
    bucket_of = lambda off: next(b for b, (lo, hi) in enumerate(buckets) if lo <= off < hi)
    return {k: off - shift[bucket_of(off)] for k, off in offsets.items()}, sum(hi - lo for lo, hi in buckets)


def check_distrib_optim_file(folder, dp, bucket_size, dtype=torch.float32, shared=()):
    """One rank's distrib_optim.pt and optimizer dict against Megatron's structure and layout."""
    assert sorted(os.listdir(folder)) == ["distrib_optim.pt", "model_optim_rng.pt"], os.listdir(folder)
    sd = torch.load(f"{folder}/model_optim_rng.pt")
    assert sd["args"].use_distributed_optimizer is True
    groups = sd["optimizer"]["optimizer"]["param_groups"]
    assert set(sd["optimizer"]) == {"optimizer"} and set(sd["optimizer"]["optimizer"]) == {"param_groups"}
    assert len(groups) == 2 and all("params" not in g and g["step"] == 3 for g in groups), groups
    check_distrib_buffer(torch.load(f"{folder}/distrib_optim.pt"), sd["model"], dp, bucket_size, dtype, shared)


def check_distrib_buffer(do, model, dp, bucket_size, dtype=torch.float32, shared=()):
    """One optimizer's dict of distrib_optim.pt over the parameters of `model` (one chunk)."""
    assert list(do) == ["buckets_coalesced", 0] and do["buckets_coalesced"] is True, list(do)
    assert list(do[0]) == [(dtype, torch.float32)], list(do[0])
    buffer = do[0][(dtype, torch.float32)]
    offsets, numel = distrib_optim_layout(model, dp, bucket_size, shared)
    assert list(buffer) == ["param", "exp_avg", "exp_avg_sq", "numel_unpadded"] and buffer["numel_unpadded"] == numel
    for key in ("param", "exp_avg", "exp_avg_sq"):
        t = buffer[key]
        assert t.dtype == torch.float32 and t.shape == (numel,) and t.device.type == "cpu", (key, t.dtype, t.shape)
    covered = torch.zeros(numel, dtype=torch.bool)
    for name, off in offsets.items():
        w = model[name].flatten()
        # `param` is the fp32 main parameter: the model's tensor is its rounding.
        assert torch.equal(buffer["param"][off:off + w.numel()].to(w.dtype), w), name
        assert (buffer["exp_avg_sq"][off:off + w.numel()] > 0).all(), name
        covered[off:off + w.numel()] = True
    for key in ("param", "exp_avg", "exp_avg_sq"):
        assert (buffer[key][~covered] == 0).all(), key  # the alignment gaps


def check_expert_parallel_distributed_optimizer(tmp):
    """An MoE run at EP=2 (world 2: DP 2, expert DP 1) with the distributed optimizer in buckets of
    1000 elements: megatron-core's ChainedOptimizer (get_megatron_optimizer) saves through
    save_parameter_state the list [dense, expert] into each EP rank's distrib_optim.pt, None for
    the dense optimizer on EP rank 1 (not its DP rank 0), each laid out over its own parameters
    and DP group; model_optim_rng.pt's optimizer is the list of both optimizers' groups. It
    resumes bit for bit, and within 1e-5 at EP=1 without the flag."""
    one = TRAIN + ["--num-experts", "4", "--moe-router-topk", "2", "--disable-bias-linear"]
    moe = one + ["--use-distributed-optimizer", "--overlap-grad-reduce", "--ddp-bucket-size", "1000",
                 "--expert-model-parallel-size", "2"]
    run(moe + ["--log-json", f"{tmp}/ep_do_full.jsonl"], procs=2)
    save = f"{tmp}/mt_ep_do"
    run(moe + ["--save", save, "--save-interval", "3", "--exit-interval", "3", "--ckpt-format", "torch"], procs=2)
    for r in range(2):
        folder = f"{save}/iter_0000003/mp_rank_00_{r:03d}"
        sd = torch.load(f"{folder}/model_optim_rng.pt")
        assert isinstance(sd["optimizer"], list) and len(sd["optimizer"]) == 2, type(sd["optimizer"])
        for o, expert in zip(sd["optimizer"], (False, True)):
            assert set(o) == {"optimizer"} and all("params" not in g and g["step"] == 3 and
                                                   g["is_expert_parallel"] is expert
                                                   for g in o["optimizer"]["param_groups"]), o
        do = torch.load(f"{folder}/distrib_optim.pt")
        assert isinstance(do, list) and len(do) == 2 and (do[0] is None) == (r == 1), do
        experts = {k: v for k, v in sd["model"].items() if ".mlp.experts.local_experts." in k}
        dense = {k: v for k, v in sd["model"].items() if k not in experts}
        if r == 0:
            check_distrib_buffer(do[0], dense, 2, 1000)
        check_distrib_buffer(do[1], experts, 1, 1000)
    full = records(f"{tmp}/ep_do_full.jsonl")
    run(moe + ["--load", save, "--log-json", f"{tmp}/ep_do_resumed.jsonl"], procs=2)
    same_records(full[3:], records(f"{tmp}/ep_do_resumed.jsonl"), "EP=2 distrib_optim.pt resumed")
    run(one + ["--load", save, "--log-json", f"{tmp}/ep_do_one.jsonl"])
    close_records(records(f"{tmp}/ep_do_one.jsonl"), full[3:], "EP=2 distrib_optim.pt in one process")


def check_distributed_optimizer(tmp):
    """--use-distributed-optimizer with --ckpt-format torch writes Megatron's distrib_optim.pt:
    DP=2 with buckets of 1000 elements (several, each cut to numel_unpadded), with one bucket,
    in bf16, and PP=2 x DP=2 (the tied embedding in a bucket of its own on both stages)."""
    overlapped = ["--use-distributed-optimizer", "--overlap-grad-reduce", "--ddp-bucket-size", "1000",
                  "--overlap-param-gather"]
    shared = ("embedding.word_embeddings.weight", "output_layer.weight")
    cases = [("buckets", overlapped, 2, 1000, torch.float32, ["mp_rank_00"], ()),
             ("bf16", ["--bf16", "--use-distributed-optimizer"], 2, math.inf, torch.bfloat16, ["mp_rank_00"], ()),
             ("PP=2", ["--use-distributed-optimizer", "--pipeline-model-parallel-size", "2"], 4, math.inf,
              torch.float32, ["mp_rank_00_000", "mp_rank_00_001"], shared),
             ("one bucket", ["--use-distributed-optimizer"], 2, math.inf, torch.float32, ["mp_rank_00"], ())]
    for label, flags, procs, bucket_size, dtype, folders, shared_names in cases:
        dist = TRAIN + flags
        tag = label.replace(" ", "_").replace("=", "")
        run(dist + ["--log-json", f"{tmp}/do_full_{tag}.jsonl"], procs=procs)
        save = f"{tmp}/mtdo_{tag}"
        run(dist + ["--save", save, "--save-interval", "3", "--exit-interval", "3", "--ckpt-format", "torch"],
            procs=procs)
        for folder in folders:
            check_distrib_optim_file(f"{save}/iter_0000003/{folder}", 2, bucket_size, dtype, shared_names)
        full = records(f"{tmp}/do_full_{tag}.jsonl")
        run(dist + ["--load", save, "--log-json", f"{tmp}/do_resumed_{tag}.jsonl"], procs=procs)
        same_records(full[3:], records(f"{tmp}/do_resumed_{tag}.jsonl"), "resume from distrib_optim.pt, " + label)
        if label == "PP=2":
            run(TRAIN + ["--load", save, "--log-json", f"{tmp}/do_pp_one.jsonl"])
            close_records(records(f"{tmp}/do_pp_one.jsonl"), full[3:], "PP=2 distrib_optim.pt in one process")
    run(dist + ["--load", save, "--log-json", f"{tmp}/do_dp4.jsonl"], procs=4)
    close_records(records(f"{tmp}/do_dp4.jsonl"), full[3:], "distrib_optim.pt at DP=2 resumed at DP=4")
    run(TRAIN + ["--load", save, "--log-json", f"{tmp}/do_one.jsonl"])
    close_records(records(f"{tmp}/do_one.jsonl"), full[3:], "distrib_optim.pt resumed without the flag")


def safetensors_tensors(path):
    data = open(path, "rb").read()
    n = struct.unpack("<Q", data[:8])[0]
    header = json.loads(data[8:8 + n])
    return {k: data[8 + n + v["data_offsets"][0]:8 + n + v["data_offsets"][1]]
            for k, v in header.items() if k != "__metadata__"}


def raw(t):
    return t.contiguous().view(torch.uint8).numpy().tobytes() if t.dim() else t.reshape(1).view(torch.uint8).numpy().tobytes()


def param_groups(names_shapes):
    """Megatron's groups: weight decay or not, in order of first appearance."""
    order, groups = [], {}
    for n, shape in names_shapes:
        wd = not (n.endswith(".bias") or len(shape) == 1)
        if wd not in groups:
            order.append(wd)
            groups[wd] = []
        groups[wd].append(n)
    return [groups[wd] for wd in order]


def check_saved_file(sd, tessera_model, tessera_optimizer):
    assert list(sd)[:4] == ["args", "checkpoint_version", "iteration", "model"], list(sd)
    assert sd["checkpoint_version"] == 3.0 and sd["iteration"] == 3
    a = sd["args"]
    assert isinstance(a, argparse.Namespace) and len(vars(a)) > 300, len(vars(a))
    assert (a.num_layers, a.hidden_size, a.padded_vocab_size, a.tensor_model_parallel_size) == (2, 32, 64, 1)
    assert a.consumed_train_samples == 12 and a.consumed_valid_samples == 0 and a.tokenizer_type == "NullTokenizer"
    assert a.params_dtype is torch.float32 and a.model_type is ModelType.encoder_or_decoder
    assert a.ckpt_format == "torch" and a.transformer_impl == "local" and a.lr == 1e-3
    # Megatron core_r0.10.0's key order, rerun_state_machine with its enums (--rerun-mode disabled).
    assert list(sd)[4:] == ["optimizer", "opt_param_scheduler", "rerun_state_machine", "rng_state",
                            "num_floating_point_operations_so_far"], list(sd)
    assert sd["rerun_state_machine"] == {"mode": RerunMode.DISABLED, "state": RerunState.NOT_RUNNING_YET,
                                         "current_iteration": 3, "rerun_requested": False,
                                         "checkpoint_requested": False}, sd["rerun_state_machine"]
    model = sd["model"]
    tensors = [(k, v) for k, v in model.items() if v is not None]
    assert [k for k, _ in tensors] == list(tessera_model), ([k for k, _ in tensors], list(tessera_model))
    for k, v in tensors:
        assert v.dtype == torch.float32 and raw(v) == tessera_model[k], k
    assert model["decoder.layers.0.self_attention.linear_qkv._extra_state"] is None
    assert "output_layer._extra_state" in model
    opt = sd["optimizer"]
    groups = param_groups([(k, tuple(v.shape)) for k, v in tensors])
    assert [len(g["params"]) for g in opt["param_groups"]] == [len(g) for g in groups]
    assert [g["weight_decay"] for g in opt["param_groups"]] == [0.1, 0.0]
    index = 0
    for g, names in zip(opt["param_groups"], groups):
        for i, n in zip(g["params"], names):
            assert i == index
            st = opt["state"][i]
            assert st["step"].item() == 3.0
            assert raw(st["exp_avg"]) == tessera_optimizer["exp_avg." + n], n
            assert raw(st["exp_avg_sq"]) == tessera_optimizer["exp_avg_sq." + n], n
            index += 1
    assert sd["opt_param_scheduler"]["num_steps"] == 12
    assert sd["opt_param_scheduler"]["lr_decay_style"] == "cosine"


def check_rng_state(sd, seed, tp, pp):
    """rng_state as Megatron's loader restores it, with the libraries' own setters: each generator
    is where Megatron's seeding leaves it (seed + 100 * pipeline rank; CUDA tracker seeds + 2718 +
    TP rank for model-parallel-rng, + 1024 + TP rank for expert-parallel-rng, offsets 0)."""
    (st,) = sd["rng_state"]
    s = seed + 100 * pp
    random.setstate(st["random_rng_state"])
    got = random.random()
    random.seed(s)
    assert got == random.random(), "random_rng_state"
    numpy.random.set_state(st["np_rng_state"])
    got = numpy.random.random_sample(3)
    numpy.random.seed(s)
    assert (got == numpy.random.random_sample(3)).all(), "np_rng_state"
    torch.manual_seed(s)
    assert torch.equal(st["torch_rng_state"], torch.get_rng_state()), "torch_rng_state"
    torch.set_rng_state(st["torch_rng_state"])
    got = torch.rand(3)
    torch.manual_seed(s)
    assert torch.equal(got, torch.rand(3)), "torch_rng_state draws"

    def cuda(seed):
        return torch.tensor(list(struct.pack("<QQ", seed, 0)), dtype=torch.uint8)
    assert torch.equal(st["cuda_rng_state"], cuda(s)), "cuda_rng_state"
    tracker = st["rng_tracker_states"]
    assert list(tracker) == ["data-parallel-rng", "model-parallel-rng", "expert-parallel-rng"], list(tracker)
    for name, want in zip(tracker, [s, s + 2718 + tp, s + 1024 + tp]):
        assert torch.equal(tracker[name], cuda(want)), name


def check_bf16_file(sd):
    model, opt = sd["model"], sd["optimizer"]
    tensors = [(k, v) for k, v in model.items() if v is not None]
    masters = [t for group in opt["fp32_from_fp16_params"] for t in group]
    groups = param_groups([(k, tuple(v.shape)) for k, v in tensors])
    by_name = dict(tensors)
    ordered = [by_name[n] for g in groups for n in g]
    assert len(masters) == len(ordered) and "optimizer" in opt and "state" in opt["optimizer"]
    for m, t in zip(masters, ordered):
        assert t.dtype == torch.bfloat16 and m.dtype == torch.float32
        assert torch.equal(m.to(torch.bfloat16), t)
    assert sd["args"].params_dtype is torch.bfloat16 and sd["args"].bf16


def deflated(tmp, good, converted):
    """torch.save stores its records; a re-zipped (deflated) copy must read the same."""
    d = os.path.join(tmp, "deflated")
    shutil.copytree(good, d)
    path = os.path.join(d, "iter_0000003", "mp_rank_00", "model_optim_rng.pt")
    with zipfile.ZipFile(path) as z:
        entries = [(i.filename, z.read(i.filename)) for i in z.infolist()]
    with zipfile.ZipFile(path, "w", zipfile.ZIP_DEFLATED) as z:
        for n, data in entries:
            z.writestr(n, data)
    run(["convert", d, f"{tmp}/conv_deflated", "--to", "tessera", "--target-tensor-parallel-size", "2"], cmd="ckpt")
    for shard in ("mp_rank_00", "mp_rank_01"):
        a = safetensors_tensors(f"{tmp}/conv_deflated/iter_0000003/{shard}/model.safetensors")
        assert a == safetensors_tensors(f"{converted}/iter_0000003/{shard}/model.safetensors"), shard


def hostile(tmp, good):
    """Each damaged copy of `good` (a torch-format checkpoint of iteration 3) must fail with an
    error naming the file; nothing may run."""
    marker = os.path.join(tmp, "EXECUTED")

    class Shell:
        def __reduce__(self):
            return (os.system, ("touch " + marker,))

    def copy_with(name, write):
        d = os.path.join(tmp, name)
        shutil.copytree(good, d)
        path = os.path.join(d, "iter_0000003", "mp_rank_00", "model_optim_rng.pt")
        write(path)
        return d, path

    def storage_too_short(path):
        with zipfile.ZipFile(path) as z:
            entries = [(i.filename, z.read(i.filename)) for i in z.infolist()]
        with zipfile.ZipFile(path, "w", zipfile.ZIP_STORED) as z:
            for n, data in entries:
                z.writestr(n, data[:4] if n.endswith("/data/0") else data)

    def truncated(path):
        data = open(path, "rb").read()
        open(path, "wb").write(data[:len(data) // 2])

    cases = [
        ("reduce", lambda p: torch.save({"args": argparse.Namespace(), "model": Shell()}, p), "posix.system", "inspect"),
        ("global", lambda p: torch.save({"args": argparse.Namespace(x=datetime.date(2020, 1, 1))}, p),
         "datetime.date", "inspect"),
        ("truncated", truncated, "not a valid zip archive", "inspect"),
        ("short_storage", storage_too_short, "than its storage", "inspect"),
        ("distributed_optimizer", lambda p: open(os.path.join(os.path.dirname(p), "distrib_optim.pt"), "wb").close(),
         "distrib_optim.pt", "train_with_optimizer"),
    ]
    for name, write, message, how in cases:
        d, path = copy_with(name, write)
        command = {"inspect": ["ckpt", "inspect", d], "train": ["train"] + TRAIN + ["--load", d, "--no-load-optim"],
                   "train_with_optimizer": ["train"] + TRAIN + ["--load", d]}[how]
        p = subprocess.run([TESSERA] + command, capture_output=True, text=True, timeout=60, env=env())
        assert p.returncode == 1, (name, p.returncode, p.stdout[-2000:], p.stderr[-2000:])
        assert "error:" in p.stderr and message in p.stderr and os.path.dirname(path) in p.stderr, (name, p.stderr)
        assert not os.path.exists(marker), "the hostile pickle ran a command"


def main():
    tmp = tempfile.mkdtemp(prefix="megatron_ckpt_")
    try:
        # 6 straight iterations, tessera's format (checkpoints at 3 and 6).
        run(TRAIN + ["--save", f"{tmp}/ts", "--save-interval", "3", "--log-json", f"{tmp}/full.jsonl"])
        full = records(f"{tmp}/full.jsonl")
        # 3 iterations saved in Megatron's format, then resumed from it to 6.
        run(TRAIN + ["--save", f"{tmp}/mt", "--save-interval", "3", "--exit-interval", "3", "--ckpt-format", "torch",
                     "--log-json", f"{tmp}/first.jsonl"])
        same_records(full[:3], records(f"{tmp}/first.jsonl"), "first 3 iterations")
        assert sorted(os.listdir(f"{tmp}/mt")) == ["iter_0000003", "latest_checkpointed_iteration.txt"]
        assert open(f"{tmp}/mt/latest_checkpointed_iteration.txt").read() == "3"
        assert os.listdir(f"{tmp}/mt/iter_0000003") == ["mp_rank_00"]
        run(TRAIN + ["--load", f"{tmp}/mt", "--log-json", f"{tmp}/resumed.jsonl"])
        same_records(full[3:], records(f"{tmp}/resumed.jsonl"), "resumed from the torch checkpoint")
        print("fp32 resume from --ckpt-format torch: bit-exact")

        sd = torch.load(f"{tmp}/mt/iter_0000003/mp_rank_00/model_optim_rng.pt")
        check_saved_file(sd, safetensors_tensors(f"{tmp}/ts/iter_0000003/mp_rank_00/model.safetensors"),
                         safetensors_tensors(f"{tmp}/ts/iter_0000003/mp_rank_00/optimizer.safetensors"))
        check_rng_state(sd, 1234, 0, 0)
        run(TRAIN + ["--save", f"{tmp}/norng", "--save-interval", "3", "--exit-interval", "3", "--ckpt-format", "torch",
                     "--no-save-rng", "--seed", "77"])
        assert "rng_state" not in torch.load(f"{tmp}/norng/iter_0000003/mp_rank_00/model_optim_rng.pt")
        print("torch.load: layout, args, model, optimizer, scheduler and rng_state as Megatron saves them")

        # Conversions: torch -> tessera (TP=2) exports what the tessera save exports;
        # -> torch (TP=1) again holds the original's model tensors.
        run(["convert", f"{tmp}/mt", f"{tmp}/conv", "--to", "tessera", "--target-tensor-parallel-size", "2"], cmd="ckpt")
        assert sorted(os.listdir(f"{tmp}/conv/iter_0000003")) == ["metadata.json", "mp_rank_00", "mp_rank_01"]
        run(["export-hf", f"{tmp}/conv", f"{tmp}/hf_conv"], cmd="ckpt")
        run(["export-hf", f"{tmp}/ts", f"{tmp}/hf_ts", "--iteration", "3"], cmd="ckpt")
        assert open(f"{tmp}/hf_conv/model.safetensors", "rb").read() == open(f"{tmp}/hf_ts/model.safetensors",
                                                                              "rb").read()
        run(["convert", f"{tmp}/conv", f"{tmp}/back", "--to", "torch", "--target-tensor-parallel-size", "1"], cmd="ckpt")
        back = torch.load(f"{tmp}/back/iter_0000003/mp_rank_00/model_optim_rng.pt")
        check_rng_state(back, 1234, 0, 0)
        assert "optimizer" not in back and back["iteration"] == 3 and back["args"].consumed_train_samples == 12
        for k, v in sd["model"].items():
            assert (v is None and back["model"][k] is None) or torch.equal(v, back["model"][k]), k
        inspect = run(["inspect", f"{tmp}/mt"], cmd="ckpt").stdout
        assert "Megatron-LM torch" in inspect and "mcore names, optimizer: fp32, 28 tensors" in inspect, inspect
        print("convert torch -> tessera TP=2 -> torch TP=1: the same tensors")

        # --bf16 in TP=2 PP=2: 16-bit model tensors, fp32 main parameters, bit-exact resume.
        par = ["--bf16", "--tensor-model-parallel-size", "2", "--pipeline-model-parallel-size", "2"]
        run(TRAIN + par + ["--log-json", f"{tmp}/bf16_full.jsonl"], procs=4)
        run(TRAIN + par + ["--save", f"{tmp}/mt16", "--save-interval", "3", "--exit-interval", "3", "--ckpt-format",
                           "torch"], procs=4)
        assert sorted(os.listdir(f"{tmp}/mt16/iter_0000003")) == ["mp_rank_00_000", "mp_rank_00_001", "mp_rank_01_000",
                                                                  "mp_rank_01_001"]
        last = torch.load(f"{tmp}/mt16/iter_0000003/mp_rank_01_001/model_optim_rng.pt")
        check_bf16_file(last)
        check_rng_state(last, 1234, 1, 1)
        assert "decoder.layers.0.input_layernorm.weight" in last["model"] and "output_layer.weight" in last["model"]
        run(TRAIN + par + ["--load", f"{tmp}/mt16", "--log-json", f"{tmp}/bf16_resumed.jsonl"], procs=4)
        same_records(records(f"{tmp}/bf16_full.jsonl")[3:], records(f"{tmp}/bf16_resumed.jsonl"), "bf16 TP2 PP2 resume")
        print("bf16 TP=2 PP=2: 16-bit model tensors, fp32_from_fp16_params, bit-exact resume")

        check_llama(tmp)
        print("Llama TP=2: [gate_r; up_r] fc1 and grouped QKV rows per rank; its release form loads as --finetune")

        plain, saved, size = check_streamed_save(tmp)
        print("a %.0f MiB save adds %.0f MiB to the run's peak memory" % (size / 2**20, (saved - plain) / 2**20))

        check_interleaved(tmp)
        print("PP=4 x 2 virtual stages: model0/model1, bit-exact resume, read by one process")

        check_distributed_optimizer(tmp)
        print("distributed optimizer: distrib_optim.pt as Megatron lays it out, resumed at DP=2, DP=4 and DP=1")
        check_expert_parallel_distributed_optimizer(tmp)
        print("EP=2: distrib_optim.pt as [dense, expert] (None on EP rank 1), resumed at EP=2 and EP=1")

        deflated(tmp, f"{tmp}/mt", f"{tmp}/conv")
        print("a checkpoint whose zip records are deflated reads the same")
        hostile(tmp, f"{tmp}/mt")
        print("hostile pickles and damaged files: errors naming the file, nothing executed")
    finally:
        shutil.rmtree(tmp, ignore_errors=True)


if __name__ == "__main__":
    main()
