#include "tessera/train/exit_signal.h"

#include <csignal>

namespace tessera {
namespace {
volatile std::sig_atomic_t g_received = 0;
extern "C" void on_exit_signal(int) { g_received = 1; }
}  // namespace

void install_exit_signal_handler() {
  struct sigaction sa {};
  sa.sa_handler = on_exit_signal;
  sigemptyset(&sa.sa_mask);
  sigaction(SIGTERM, &sa, nullptr);
  sigaction(SIGINT, &sa, nullptr);
}

bool exit_signal_received() { return g_received != 0; }

}  // namespace tessera
