#include "tessera/train/exit_signal.h"

#include <pthread.h>
#include <signal.h>

#include <atomic>
#include <filesystem>
#include <iterator>
#include <thread>

#include "tessera/core/error.h"

namespace tessera {
namespace {

std::atomic<bool> g_received{false};

sigset_t exit_signals() {
  sigset_t set;
  sigemptyset(&set);
  sigaddset(&set, SIGTERM);
  sigaddset(&set, SIGINT);
  return set;
}

std::ptrdiff_t thread_count() {
  return std::distance(std::filesystem::directory_iterator("/proc/self/task"), std::filesystem::directory_iterator());
}

// Runs for the life of the process: every later signal only confirms the request.
void take_exit_signals(sigset_t set) {
  for (;;) {
    int sig = 0;
    if (sigwait(&set, &sig) == 0) g_received.store(true);
  }
}

}  // namespace

void install_exit_signal_handler() {
  TESSERA_CHECK(thread_count() == 1, "install_exit_signal_handler runs after another thread started, which would "
                                     "still take SIGTERM/SIGINT on its own stack");
  const sigset_t set = exit_signals();
  pthread_sigmask(SIG_BLOCK, &set, nullptr);
  std::thread(take_exit_signals, set).detach();
}

bool exit_signal_received() { return g_received.load(); }

}  // namespace tessera
