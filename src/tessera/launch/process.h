// Process primitives of the launcher: starting a worker in its own process group with its
// output piped back, relaying that output line by line (rank prefix, log file, a tail kept
// for failure reports), turning signals into poll()-able events, and naming wait statuses.
#pragma once

#include <sys/types.h>

#include <chrono>
#include <deque>
#include <map>
#include <string>
#include <vector>

namespace tessera::launch {

// ---- starting a worker ---------------------------------------------------------------------

struct SpawnSpec {
  std::string path;                          // resolved executable
  std::vector<std::string> argv;             // argv[0] included
  std::map<std::string, std::string> env;    // set on top of the launcher's environment
};

struct SpawnedWorker {
  pid_t pid = -1;   // also the worker's process group id
  int stdout_fd = -1;
  int stderr_fd = -1;
};

// fork + execve: the child becomes the leader of a new process group (so a signal to -pid
// reaches everything it starts), gets SIGKILL if the launcher dies (PR_SET_PDEATHSIG),
// default signal dispositions, stdin from /dev/null, stdout/stderr on non-blocking pipes
// read by the launcher, and no other inherited descriptors. Throws tessera::Error when the program
// cannot be executed (the error pipe reports execve's errno).
SpawnedWorker spawn_worker(const SpawnSpec& spec);

// Finds `name` on PATH (or checks it when it contains '/'); "" when not found/executable.
std::string find_executable(const std::string& name);

// ---- wait statuses ---------------------------------------------------------------------------

// "exited with code 3", "was killed by signal SIGKILL (9)", "... (core dumped)".
std::string describe_wait_status(int status);
// 0 for success, the exit code, or 128 + signal.
int exit_code_of(int status);
// "SIGTERM" for 15.
std::string signal_name(int sig);

// ---- output ------------------------------------------------------------------------------------

// The last `capacity` lines a worker wrote (stdout and stderr as they arrived).
class LineTail {
 public:
  explicit LineTail(size_t capacity = 20) : capacity_(capacity) {}
  void add(std::string line);
  const std::deque<std::string>& lines() const { return lines_; }

 private:
  size_t capacity_;
  std::deque<std::string> lines_;
};

// One of a worker's two streams: reads what is available, splits it into lines, and sends
// each line to the console (prefixed, in one write), the log file and the tail. A partial
// line is held until its newline, until 64 KiB pile up, or until the stream ends. The fd
// must be non-blocking (spawn_worker's are); the relay owns it and the log fd.
class OutputRelay {
 public:
  OutputRelay() = default;
  OutputRelay(int fd, int console_fd, std::string prefix, int log_fd, LineTail* tail);
  OutputRelay(OutputRelay&& other) noexcept;
  OutputRelay& operator=(OutputRelay&& other) noexcept;
  OutputRelay(const OutputRelay&) = delete;
  ~OutputRelay();

  int fd() const { return fd_; }
  bool open() const { return fd_ >= 0; }
  // Reads until the pipe is empty; at end of stream flushes and closes. Returns bytes read.
  size_t pump();
  // Flushes any partial line and closes the pipe (data still in it is read first).
  void close();

 private:
  void emit(const char* data, size_t n);
  int fd_ = -1;
  int console_fd_ = -1;  // -1: not shown on the console
  std::string prefix_;
  int log_fd_ = -1;      // owned
  LineTail* tail_ = nullptr;
  std::string partial_;
};

// Writes everything (retrying on EINTR and short writes); errors such as EPIPE are ignored
// so a closed console never stops supervision.
void write_all(int fd, const std::string& data);

// ---- signals ---------------------------------------------------------------------------------

// Installs handlers for SIGINT, SIGTERM, SIGHUP, SIGQUIT and SIGCHLD that write to a
// non-blocking pipe; ignores SIGPIPE. Restores the previous handlers when destroyed.
// One at a time per process.
class SignalWatcher {
 public:
  SignalWatcher();
  ~SignalWatcher();
  SignalWatcher(const SignalWatcher&) = delete;
  SignalWatcher& operator=(const SignalWatcher&) = delete;

  int fd() const;  // readable when a signal arrived
  // Drains the pipe; returns the terminating signals received since the last call, in order
  // (SIGCHLD is consumed silently).
  std::vector<int> take();
};

}  // namespace tessera::launch
