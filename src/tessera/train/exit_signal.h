// --exit-signal-handler: SIGTERM (or SIGINT) asks the trainer to save a checkpoint and exit
// cleanly at the end of the current iteration, instead of dying mid-step.
//
// No handler runs on a thread that computes: oneDNN's sgemm kernels point the stack pointer
// into a heap buffer while they run, so a signal frame pushed on such a thread lands in the
// heap below that buffer (a corrupted heap, then a crash in a later malloc or free). Both
// signals are blocked in every thread instead, and one thread that does nothing else takes
// them with sigwait.
#pragma once

namespace tessera {

// Blocks SIGTERM and SIGINT and starts the thread that takes them. Threads inherit the
// signal mask when they start, so this must run before any other thread exists (checked).
void install_exit_signal_handler();
bool exit_signal_received();

}  // namespace tessera
