// `tessera bench comm` (also bench/comm_bench): an nccl-tests-style sweep of one collective
// through tessera's Communicator (Gloo backend), side by side with the same Gloo call made
// directly on a raw gloo::Context at the same sizes.
//
//   tessera bench comm --spawn 2 -b 1K -e 256M -f 4          2 local ranks, forked
//   tessera launch --nproc_per_node 2 tessera bench comm ...  under the launcher
//   torchrun --nproc_per_node 2 ... (RANK/WORLD_SIZE/MASTER_*; rank 0 serves the store)
//
// Flags (nccl-tests' names): -b/--minbytes, -e/--maxbytes, -f/--stepfactor, -n/--iters,
// -w/--warmup_iters, -R/--rounds, -c/--check 0|1, -d/--datatype float|int32|int64, -o/--op sum|max,
// -C/--coll all_reduce|all_gather|reduce_scatter|broadcast, --raw 0|1, --spawn N,
// --timeout-minutes M, --device SPEC (tessera's buffers on that device: the host-staged
// path, timed against raw Gloo on host memory). Sizes take K/M/G suffixes (powers of 1024).
//
// Columns: size (bytes of the whole buffer), count (elements), time (us per call: the
// slowest rank's mean over -n calls, best of -R rounds that alternate tessera and raw Gloo), algbw = size / time, busbw = algbw x the collective's factor
// (all_reduce 2(n-1)/n, all_gather and reduce_scatter (n-1)/n, broadcast 1), #wrong
// (elements that differ from the exact expected value, summed over ranks, with -c 1), then
// the raw Gloo figures and the ratio of the two busbw.
#pragma once

namespace tessera {

// argv excludes the subcommand words. Returns the process exit status.
int run_comm_bench(int argc, char** argv);

}  // namespace tessera
