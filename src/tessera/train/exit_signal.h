// --exit-signal-handler: SIGTERM (or SIGINT) asks the trainer to save a checkpoint and exit
// cleanly at the end of the current iteration, instead of dying mid-step.
#pragma once

namespace tessera {

void install_exit_signal_handler();
bool exit_signal_received();

}  // namespace tessera
