#!/usr/bin/python3
"""Expert parallelism (--expert-model-parallel-size, Megatron's MoE token dispatchers) through
`tessera train`, a tiny SwiGLU MoE (4 experts, top-2, aux loss 0.01) for 3 iterations:
- EP=2 (allgather and alltoall), EP=4 (world 4), EP=2 x TP=2 with sequence parallelism,
  EP=2 x PP=2, EP=2 with the distributed optimizer (world 2, and world 4 = expert DP 2 with
  overlapped reduction in small buckets), EP=2 on the strict device, give the lm loss and
  gradient norm of one process within 1e-5 relative (model_parallel_test's bound; measured:
  within 1e-8);
- their load_balancing_loss equals that of the data-parallel run of the same world within
  1e-7: as in Megatron, routing and the aux loss stay on each rank's own tokens and the logged
  value is the last rank's (track_moe_metrics reduces it over PP and the sequence partition,
  not over DP), so one process, which logs the mean over all micro-batches, is no reference;
- EP=2 alltoall with capacity (padded, the position drop policy: each rank drops among its own
  tokens, as in Megatron) and EP=2 allgather in bf16 (its reduce-scatter sums in f32) equal
  one process of the same flags (bf16: mixed_precision_test's bound);
- checkpoints: an EP=2 save (tessera's format; torch_dist with the distributed optimizer over
  expert DP 2; Megatron's torch format, each EP rank's chained dense and expert optimizers)
  resumes at EP=1, at EP=2 x TP=2 + SP and at EP=2 with the distributed optimizer with the
  uninterrupted run's losses and norms (1e-5);
- MoE with context parallelism (issue 32): the aux loss counts tokens over the CP ranks
  (Megatron's TP x CP sequence partition), so CP=2, CP=2 x TP=2 + SP and CP=2 x EP=2 give one
  process's lm loss, gradient norm (1e-5) and load_balancing_loss (1e-7), with an aux
  coefficient of 1 so that the aux term's share of the norm (about 1e-2) would show a wrong
  scale;
- --deterministic-mode, one micro-batch per rank (every gradient sum over data parallelism in
  one canonical order: docs/distributed.md, Expert parallelism): at world 2, EP=2 alltoall logs
  the lm loss and gradient norm of the data-parallel run (EP=1) bit for bit for 6 iterations,
  and an EP=2 save at iteration 3 resumed at EP=1 logs the uninterrupted run's last 3 bit for
  bit; at world 4 (4 iterations), EP=2, EP=4 and EP=2 with overlapped small buckets log DP=4's
  bits, so does the distributed optimizer (DP=4 and EP=2, clipping on: its norm is taken over
  the gathered whole gradients in this mode), and EP=2 saves at iteration 2 (tessera,
  torch_dist) resume at EP=1 and at EP=4 bit for bit; at world 2 the EP=2 save at iteration 3
  in Megatron's torch format too (its chained dense and expert optimizers), resumed at EP=1
  and at EP=2; allgather (its combine's fused
  multiply-adds) within 1e-5 at both worlds;
- a layout whose context x data parallel size EP does not divide exits 2 naming the flag.
usage: expert_parallel_test.py TESSERA_BINARY"""
import os
import subprocess
import sys
import tempfile
import time

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import mixed_precision_test as mixed  # noqa: E402  (the bf16 bounds)
import model_parallel_test as mp  # noqa: E402  (the tiny run, its runner and log reader)

MOE = ["--num-layers", "2", "--global-batch-size", "4", "--train-iters", "3", "--eval-iters", "0",
       "--num-experts", "4", "--moe-router-topk", "2", "--moe-aux-loss-coeff", "0.01", "--disable-bias-linear",
       "--swiglu"] + mp.NO_DROPOUT
EP2, EP4 = ["--expert-model-parallel-size", "2"], ["--expert-model-parallel-size", "4"]
ALLTOALL = ["--moe-token-dispatcher-type", "alltoall"]
LB_RTOL = 1e-7

# (label, processes, flags)
LAYOUTS = [
    ("ep2 allgather", 2, EP2),
    ("ep2 alltoall", 2, EP2 + ALLTOALL),
    # the strict device fails any host access to device memory outside a backend
    ("ep2 alltoall strict", 2, EP2 + ALLTOALL + ["--device", "strict"]),
    ("ep4 alltoall", 4, EP4 + ALLTOALL),
    ("ep2 tp2 sp", 4, EP2 + ["--tensor-model-parallel-size", "2", "--sequence-parallel"]),
    ("ep2 pp2 alltoall", 4, EP2 + ALLTOALL + ["--pipeline-model-parallel-size", "2"]),
    ("ep2 distributed optimizer", 2, EP2 + ["--use-distributed-optimizer"]),
    ("ep2 edp2 distributed optimizer", 4, EP2 + ALLTOALL + ["--use-distributed-optimizer", "--overlap-grad-reduce",
                                                             "--ddp-bucket-size", "3000"]),
]


def without_ep(flags):
    """The same layout with expert parallelism 1 (the data-parallel reference's)."""
    out, skip = [], False
    for f in flags:
        if skip:
            skip = False
        elif f in ("--expert-model-parallel-size", "--moe-token-dispatcher-type"):
            skip = True
        else:
            out.append(f)
    return out


def test_layouts(tmp):
    reference, _ = mp.train(tmp, "ep single", 1, MOE)
    dp_references = {}
    for label, procs, flags in LAYOUTS:
        t0 = time.monotonic()
        got, _ = mp.train(tmp, label, procs, MOE + flags)
        mp.compare(reference, got, label)
        key = (procs, tuple(without_ep(flags)))
        if key not in dp_references:
            dp_references[key], _ = mp.train(tmp, "dp %s" % label, procs, MOE + list(key[1]))
        for a, b in zip(dp_references[key], got):
            assert abs(a["load_balancing_loss"] - b["load_balancing_loss"]) <= LB_RTOL * a["load_balancing_loss"], (
                label, a, b)
        print("ok  %-32s %d processes  %.1f s" % (label, procs, time.monotonic() - t0), flush=True)


def test_capacity_and_bf16(tmp):
    rtol = {"lm_loss": mixed.LOSS_RTOL, "grad_norm": mixed.NORM_RTOL}
    # (label, flags of both runs, bf16); capacity needs the alltoall dispatcher (Megatron's rule)
    cases = [("ep2 alltoall capacity padded position", ALLTOALL + [
        "--moe-expert-capacity-factor", "1.0", "--moe-pad-expert-input-to-capacity", "--moe-token-drop-policy",
        "position"], False), ("ep2 allgather bf16", ["--bf16"], True)]
    for label, flags, bf16 in cases:
        reference, _ = mp.train(tmp, "single " + label, 1, MOE + flags)
        got, _ = mp.train(tmp, label, 2, MOE + flags + EP2)
        if not bf16:
            mp.compare(reference, got, label)
        for a, b in zip(reference, got):
            for key in ("lm_loss", "grad_norm") if bf16 else ():
                assert abs(a[key] - b[key]) <= rtol[key] * abs(a[key]), (label, key, a, b)
        print("ok  %s equals one process" % label, flush=True)


def test_checkpoints(tmp):
    four = MOE + ["--train-iters", "4"]
    reference, _ = mp.train(tmp, "ep ckpt reference", 1, four)
    distributed = ["--use-distributed-optimizer"]
    # (format, label, processes, flags): torch's distrib_optim.pt at world 4 is the expert
    # optimizer's over expert DP 2, in buckets of its own.
    saves = [("tessera", "", 2, EP2), ("torch_dist", "", 4, EP2 + ALLTOALL + distributed), ("torch", "", 2, EP2),
             ("torch", " distributed optimizer", 2, EP2 + distributed),
             ("torch", " distributed optimizer edp2", 4, EP2 + ALLTOALL + distributed + [
                 "--overlap-grad-reduce", "--ddp-bucket-size", "3000"])]
    resumes = [("ep1", 1, []), ("ep2 tp2 sp", 4, EP2 + ["--tensor-model-parallel-size", "2", "--sequence-parallel"]),
               ("ep2 distributed optimizer", 2, EP2 + distributed)]
    for fmt, label, procs, flags in saves:
        save = os.path.join(tmp, ("ep_save_" + fmt + label).replace(" ", "_"))
        mp.train(tmp, "ep ckpt save " + fmt + label, procs, four + flags + [
            "--save", save, "--save-interval", "2", "--exit-interval", "2", "--ckpt-format", fmt])
        for resume, rprocs, rflags in resumes:
            resumed, _ = mp.train(tmp, "ep ckpt %s%s resume %s" % (fmt, label, resume), rprocs,
                                  four + rflags + ["--load", save])
            mp.compare(reference[2:], resumed, "%s%s save resumed at %s" % (fmt, label, resume))
        print("ok  an EP=2 %s%s save resumes at EP=1, EP=2 x TP=2 and EP=2 with the distributed optimizer"
              % (fmt, label), flush=True)


def test_context_parallel(tmp):
    model = MOE + ["--moe-aux-loss-coeff", "1.0"]
    reference, _ = mp.train(tmp, "moe cp reference", 1, model)
    cp2 = ["--context-parallel-size", "2"]
    for label, procs, flags in (("cp2", 2, cp2),
                                ("cp2 tp2 sp", 4, cp2 + ["--tensor-model-parallel-size", "2", "--sequence-parallel"]),
                                ("cp2 ep2 alltoall", 2, cp2 + EP2 + ALLTOALL)):
        got, _ = mp.train(tmp, "moe " + label, procs, model + flags)
        mp.compare(reference, got, "moe " + label)
        for a, b in zip(reference, got):
            assert abs(a["load_balancing_loss"] - b["load_balancing_loss"]) <= LB_RTOL * a["load_balancing_loss"], (
                label, a, b)
        print("ok  MoE %s equals one process (lm loss, grad norm, load_balancing_loss)" % label, flush=True)


def test_deterministic(tmp):
    # One micro-batch per rank: an EP rank's runs of an expert then are the DP ranks' GEMMs.
    det = MOE + ["--deterministic-mode", "--global-batch-size", "2", "--train-iters", "6"]
    reference, _ = mp.train(tmp, "det dp2", 2, det)
    got, _ = mp.train(tmp, "det ep2 alltoall", 2, det + EP2 + ALLTOALL)
    mp.compare(reference, got, "det ep2 alltoall", exact=True)
    # allgather: each token's weighted sum of its k expert outputs is split over the EP ranks
    # and added by the reduce-scatter, not in one rank's fused multiply-adds (docs/distributed.md).
    got, _ = mp.train(tmp, "det ep2 allgather", 2, det + EP2)
    mp.compare(reference, got, "det ep2 allgather")
    for fmt in ("tessera", "torch_dist", "torch"):
        save = os.path.join(tmp, "det_ep2_save_" + fmt)
        first, _ = mp.train(tmp, "det ep2 save " + fmt, 2, det + EP2 + ALLTOALL + [
            "--save", save, "--save-interval", "3", "--exit-interval", "3", "--ckpt-format", fmt])
        mp.compare(reference[:3], first, "det ep2 save " + fmt, exact=True)
        resumed, _ = mp.train(tmp, "det ep2 resume ep1 " + fmt, 2, det + ["--load", save])
        mp.compare(reference[3:], resumed, "det ep2 %s save resumed at ep1" % fmt, exact=True)
    # Megatron's torch format keeps each EP rank's chained dense and expert optimizers
    # (mp_rank_00_EEE): they resume at EP=2 too.
    resumed, _ = mp.train(tmp, "det ep2 resume ep2 torch", 2, det + EP2 + ALLTOALL + [
        "--load", os.path.join(tmp, "det_ep2_save_torch")])
    mp.compare(reference[3:], resumed, "det ep2 torch save resumed at ep2", exact=True)
    print("ok  --deterministic-mode: EP=2 alltoall equals EP=1 (DP=2) bit for bit, and an EP=2 save (tessera, "
          "torch_dist, torch) resumes at EP=1 so (torch: at EP=2 too)", flush=True)
    test_deterministic_world4(tmp)


def test_deterministic_world4(tmp):
    # World 4: the gradient sums over DP 4, over expert DP 2 of EP=2's block sums and inside
    # EP=4's ranks must all add the four DP ranks' gradients in the one canonical order.
    det = MOE + ["--deterministic-mode", "--train-iters", "4"]
    reference, _ = mp.train(tmp, "det dp4", 4, det)
    for label, flags in (("ep2", EP2 + ALLTOALL), ("ep4", EP4 + ALLTOALL),
                         ("ep2 overlapped", EP2 + ALLTOALL + ["--overlap-grad-reduce", "--ddp-bucket-size", "3000"])):
        got, _ = mp.train(tmp, "det4 " + label, 4, det + flags)
        mp.compare(reference, got, "det world 4 " + label, exact=True)
    # The distributed optimizer: its reduce-scatter gives the same gradients, and in this mode
    # its norm is taken over the gathered whole gradients, so clipping (which acts: the norms
    # exceed --clip-grad) scales the updates alike and the losses and norms keep DP=4's bits.
    clip = float(mp.TRAIN[mp.TRAIN.index("--clip-grad") + 1])
    assert max(r["grad_norm"] for r in reference) > clip, ("the reference does not clip", reference)
    for label, flags in (("dp4", []), ("ep2", EP2 + ALLTOALL)):
        got, _ = mp.train(tmp, "det4 distributed optimizer " + label, 4, det + flags + [
            "--use-distributed-optimizer", "--overlap-grad-reduce", "--ddp-bucket-size", "3000"])
        mp.compare(reference, got, "det world 4 distributed optimizer " + label, exact=True)
    got, _ = mp.train(tmp, "det4 ep2 allgather", 4, det + EP2)
    mp.compare(reference, got, "det world 4 ep2 allgather")
    for fmt in ("tessera", "torch_dist"):
        save = os.path.join(tmp, "det4_ep2_save_" + fmt)
        mp.train(tmp, "det4 ep2 save " + fmt, 4, det + EP2 + ALLTOALL + [
            "--save", save, "--save-interval", "2", "--exit-interval", "2", "--ckpt-format", fmt])
        for label, flags in (("ep1", []), ("ep4", EP4 + ALLTOALL)):
            resumed, _ = mp.train(tmp, "det4 ep2 resume %s %s" % (label, fmt), 4, det + flags + ["--load", save])
            mp.compare(reference[2:], resumed, "det world 4 ep2 %s save resumed at %s" % (fmt, label), exact=True)
    print("ok  --deterministic-mode at world 4: EP=2, EP=4 and the distributed optimizer (DP=4, EP=2, clipping) equal DP=4 bit for "
          "bit, and an EP=2 save (tessera, torch_dist) resumes at EP=1 and EP=4 so", flush=True)


def test_layout_errors():
    p = subprocess.run([mp.TESSERA, "launch", "--standalone", "--nproc_per_node", "2", "train"] + mp.TRAIN + MOE + EP4,
                       capture_output=True, text=True, timeout=120, env=mp.env_without_launch())
    out = p.stdout + p.stderr
    assert p.returncode != 0 and "--expert-model-parallel-size (4) does not divide the context x data parallel size 2" \
        in out, (p.returncode, out[-2000:])
    print("ok  an expert-parallel size that CP x DP does not divide exits naming the flag", flush=True)


def main():
    with tempfile.TemporaryDirectory() as tmp:
        if os.environ.get("EP_TEST_ONLY") == "deterministic":
            return test_deterministic(tmp)
        test_deterministic(tmp)
        test_layouts(tmp)
        test_capacity_and_bf16(tmp)
        test_checkpoints(tmp)
        test_context_parallel(tmp)
        test_layout_errors()


if __name__ == "__main__":
    main()
