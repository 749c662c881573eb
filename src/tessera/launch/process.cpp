#include "tessera/launch/process.h"

#include <fcntl.h>
#include <signal.h>
#include <sys/prctl.h>
#include <sys/stat.h>
#include <sys/syscall.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cerrno>
#include <cstring>
#include <set>

#include "tessera/core/error.h"

extern char** environ;

namespace tessera::launch {
namespace {

constexpr size_t kMaxPartial = 64 * 1024;  // a "line" longer than this is emitted in pieces
constexpr size_t kMaxTailLine = 2000;      // characters of one line kept for failure reports
constexpr size_t kMaxPumpBytes = 1 << 20;  // per pump() call, so one chatty worker cannot starve others

void set_nonblocking(int fd) { ::fcntl(fd, F_SETFL, ::fcntl(fd, F_GETFL) | O_NONBLOCK); }

// The child's descriptors 3.. are closed, except `keep`.
void close_from(int first, int keep) {
#ifdef SYS_close_range
  if (keep >= first) {
    if (keep > first) ::syscall(SYS_close_range, first, keep - 1, 0);
    if (::syscall(SYS_close_range, keep + 1, ~0U, 0) == 0) return;
  } else if (::syscall(SYS_close_range, first, ~0U, 0) == 0) {
    return;
  }
#endif
  for (int fd = first; fd < 4096; ++fd)
    if (fd != keep) ::close(fd);
}

}  // namespace

// ---- starting a worker ---------------------------------------------------------------------

std::string find_executable(const std::string& name) {
  auto ok = [](const std::string& p) {
    struct stat st{};
    return ::stat(p.c_str(), &st) == 0 && S_ISREG(st.st_mode) && ::access(p.c_str(), X_OK) == 0;
  };
  if (name.empty()) return "";
  if (name.find('/') != std::string::npos) return ok(name) ? name : "";
  const char* path = std::getenv("PATH");
  std::string dirs = path ? path : "/usr/local/bin:/usr/bin:/bin";
  size_t pos = 0;
  while (pos <= dirs.size()) {
    size_t colon = dirs.find(':', pos);
    std::string dir = dirs.substr(pos, colon == std::string::npos ? std::string::npos : colon - pos);
    std::string candidate = (dir.empty() ? "." : dir) + "/" + name;
    if (ok(candidate)) return candidate;
    if (colon == std::string::npos) break;
    pos = colon + 1;
  }
  return "";
}

namespace {

// The child's environment (the launcher's, with spec.env set on top) and argv as execve takes
// them, built before fork: after it, the child makes only async-signal-safe calls. Pinned in
// place, as the pointers point into the strings.
class ExecArgs {
 public:
  explicit ExecArgs(const SpawnSpec& spec) : argv_strings_(spec.argv) {
    for (char** e = environ; e && *e; ++e) {
      std::string entry = *e;
      std::string name = entry.substr(0, entry.find('='));
      if (!spec.env.count(name)) env_strings_.push_back(std::move(entry));
    }
    for (const auto& [k, v] : spec.env) env_strings_.push_back(k + "=" + v);
    for (auto& s : env_strings_) envp_.push_back(s.data());
    envp_.push_back(nullptr);
    for (auto& s : argv_strings_) argvp_.push_back(s.data());
    argvp_.push_back(nullptr);
  }
  ExecArgs(const ExecArgs&) = delete;
  ExecArgs& operator=(const ExecArgs&) = delete;

  char* const* envp() const { return envp_.data(); }
  char* const* argv() const { return argvp_.data(); }

 private:
  std::vector<std::string> env_strings_, argv_strings_;
  std::vector<char*> envp_, argvp_;
};

// The descriptors a child is started with: stdin is /dev/null (a worker is not in the
// terminal's foreground process group, so reading the terminal would stop it with SIGTTIN
// instead of failing); stdout, stderr and the exec-error pipe lead back to the launcher.
struct ChildFds {
  int null_fd;
  int out[2], err[2], ep[2];

  void close_all() const {
    for (int fd : {null_fd, out[0], out[1], err[0], err[1], ep[0], ep[1]}) ::close(fd);
  }
};

ChildFds open_child_fds() {
  ChildFds f{};
  f.null_fd = ::open("/dev/null", O_RDONLY | O_CLOEXEC);
  if (f.null_fd < 0) throw runtime_error(std::string("/dev/null: ") + std::strerror(errno));
  if (::pipe2(f.out, O_CLOEXEC) != 0) {
    ::close(f.null_fd);
    throw runtime_error(std::string("pipe: ") + std::strerror(errno));
  }
  if (::pipe2(f.err, O_CLOEXEC) != 0) {
    ::close(f.null_fd), ::close(f.out[0]), ::close(f.out[1]);
    throw runtime_error(std::string("pipe: ") + std::strerror(errno));
  }
  if (::pipe2(f.ep, O_CLOEXEC) != 0) {
    ::close(f.null_fd), ::close(f.out[0]), ::close(f.out[1]), ::close(f.err[0]), ::close(f.err[1]);
    throw runtime_error(std::string("pipe: ") + std::strerror(errno));
  }
  return f;
}

// The child after fork: its own process group, killed with the launcher, default signal
// handling, the descriptors of `fds` and no others; execve's errno goes back on the error pipe.
// `dfl` and `none` are built before fork.
[[noreturn]] void exec_child(const SpawnSpec& spec, const ExecArgs& args, const ChildFds& fds, pid_t parent,
                             const struct sigaction& dfl, const sigset_t& none) {
  ::setpgid(0, 0);
  ::prctl(PR_SET_PDEATHSIG, SIGKILL);
  if (::getppid() != parent) ::_exit(127);  // the launcher is already gone
  for (int sig : {SIGINT, SIGTERM, SIGHUP, SIGQUIT, SIGCHLD, SIGPIPE}) ::sigaction(sig, &dfl, nullptr);
  ::sigprocmask(SIG_SETMASK, &none, nullptr);
  ::dup2(fds.null_fd, 0);
  ::dup2(fds.out[1], 1);
  ::dup2(fds.err[1], 2);
  close_from(3, fds.ep[1]);
  ::execve(spec.path.c_str(), args.argv(), args.envp());
  int e = errno;
  ssize_t ignored = ::write(fds.ep[1], &e, sizeof e);
  (void)ignored;
  ::_exit(127);
}

// execve's errno as the child reported it, or 0 when the pipe closed on a successful exec.
int exec_errno(int ep_read) {
  int child_errno = 0;
  ssize_t n;
  do n = ::read(ep_read, &child_errno, sizeof child_errno);
  while (n < 0 && errno == EINTR);
  ::close(ep_read);
  return n == static_cast<ssize_t>(sizeof child_errno) ? child_errno : 0;
}

}  // namespace

SpawnedWorker spawn_worker(const SpawnSpec& spec) {
  const ExecArgs args(spec);
  const ChildFds fds = open_child_fds();
  struct sigaction dfl{};
  dfl.sa_handler = SIG_DFL;
  sigemptyset(&dfl.sa_mask);
  sigset_t none;
  sigemptyset(&none);
  const pid_t parent = ::getpid();

  pid_t pid = ::fork();
  if (pid < 0) {
    int e = errno;
    fds.close_all();
    throw runtime_error(std::string("fork: ") + std::strerror(e), "the machine may be out of processes or memory");
  }
  if (pid == 0) exec_child(spec, args, fds, parent, dfl, none);
  ::setpgid(pid, pid);  // also here, so that signalling -pid works at once (EACCES after exec is fine)
  ::close(fds.null_fd);
  ::close(fds.out[1]);
  ::close(fds.err[1]);
  ::close(fds.ep[1]);
  if (const int child_errno = exec_errno(fds.ep[0])) {
    int status;
    while (::waitpid(pid, &status, 0) < 0 && errno == EINTR) {
    }
    ::close(fds.out[0]);
    ::close(fds.err[0]);
    throw runtime_error("could not start " + spec.path + ": " + std::strerror(child_errno),
                        "check that the program exists and is executable on this node");
  }
  set_nonblocking(fds.out[0]);
  set_nonblocking(fds.err[0]);
  return {pid, fds.out[0], fds.err[0]};
}

// ---- wait statuses ---------------------------------------------------------------------------

std::string signal_name(int sig) {
  const char* abbrev = ::sigabbrev_np(sig);
  return abbrev ? std::string("SIG") + abbrev : "signal " + std::to_string(sig);
}

std::string describe_wait_status(int status) {
  if (WIFEXITED(status)) return "exited with code " + std::to_string(WEXITSTATUS(status));
  if (WIFSIGNALED(status)) {
    int sig = WTERMSIG(status);
    return "was killed by signal " + signal_name(sig) + " (" + std::to_string(sig) + ")" +
           (WCOREDUMP(status) ? " (core dumped)" : "");
  }
  return "ended with wait status " + std::to_string(status);
}

int exit_code_of(int status) {
  if (WIFEXITED(status)) return WEXITSTATUS(status);
  if (WIFSIGNALED(status)) return 128 + WTERMSIG(status);
  return 1;
}

// ---- output ------------------------------------------------------------------------------------

void write_all(int fd, const std::string& data) {
  size_t done = 0;
  while (done < data.size()) {
    ssize_t n = ::write(fd, data.data() + done, data.size() - done);
    if (n < 0 && errno == EINTR) continue;
    if (n < 0 && errno == EAGAIN) {
      ::usleep(1000);
      continue;
    }
    if (n <= 0) return;
    done += static_cast<size_t>(n);
  }
}

void LineTail::add(std::string line) {
  if (line.size() > kMaxTailLine) line = line.substr(0, kMaxTailLine) + " [...]";
  lines_.push_back(std::move(line));
  while (lines_.size() > capacity_) lines_.pop_front();
}

OutputRelay::OutputRelay(int fd, int console_fd, std::string prefix, int log_fd, LineTail* tail)
    : fd_(fd), console_fd_(console_fd), prefix_(std::move(prefix)), log_fd_(log_fd), tail_(tail) {}

OutputRelay::OutputRelay(OutputRelay&& o) noexcept { *this = std::move(o); }

OutputRelay& OutputRelay::operator=(OutputRelay&& o) noexcept {
  if (this != &o) {
    close();
    fd_ = o.fd_;
    console_fd_ = o.console_fd_;
    prefix_ = std::move(o.prefix_);
    log_fd_ = o.log_fd_;
    tail_ = o.tail_;
    partial_ = std::move(o.partial_);
    o.fd_ = o.log_fd_ = -1;
  }
  return *this;
}

OutputRelay::~OutputRelay() { close(); }

void OutputRelay::emit(const char* data, size_t n) {
  std::string line(data, n);
  if (console_fd_ >= 0) write_all(console_fd_, prefix_ + line + "\n");
  if (tail_) tail_->add(std::move(line));
}

size_t OutputRelay::pump() {
  if (fd_ < 0) return 0;
  char buf[65536];
  size_t total = 0;
  while (total < kMaxPumpBytes) {
    ssize_t n = ::read(fd_, buf, sizeof buf);
    if (n < 0 && errno == EINTR) continue;
    if (n < 0) break;  // EAGAIN: empty for now
    if (n == 0) {       // end of stream
      if (!partial_.empty()) emit(partial_.data(), partial_.size());
      partial_.clear();
      ::close(fd_);
      fd_ = -1;
      break;
    }
    total += static_cast<size_t>(n);
    if (log_fd_ >= 0) write_all(log_fd_, std::string(buf, static_cast<size_t>(n)));
    partial_.append(buf, static_cast<size_t>(n));
    size_t start = 0;
    for (size_t nl; (nl = partial_.find('\n', start)) != std::string::npos; start = nl + 1)
      emit(partial_.data() + start, nl - start);
    partial_.erase(0, start);
    while (partial_.size() >= kMaxPartial) {
      emit(partial_.data(), kMaxPartial);
      partial_.erase(0, kMaxPartial);
    }
  }
  return total;
}

void OutputRelay::close() {
  if (fd_ >= 0) {
    pump();
    if (fd_ >= 0) {
      if (!partial_.empty()) emit(partial_.data(), partial_.size());
      partial_.clear();
      ::close(fd_);
      fd_ = -1;
    }
  }
  if (log_fd_ >= 0) {
    ::close(log_fd_);
    log_fd_ = -1;
  }
}

// ---- signals ---------------------------------------------------------------------------------

namespace {

int g_signal_pipe[2] = {-1, -1};
const int kWatched[] = {SIGINT, SIGTERM, SIGHUP, SIGQUIT, SIGCHLD};
struct sigaction g_previous[sizeof kWatched / sizeof kWatched[0]];
struct sigaction g_previous_pipe;

void on_signal(int sig) {
  int saved = errno;
  unsigned char b = static_cast<unsigned char>(sig);
  ssize_t ignored = ::write(g_signal_pipe[1], &b, 1);
  (void)ignored;
  errno = saved;
}

}  // namespace

SignalWatcher::SignalWatcher() {
  TESSERA_CHECK(g_signal_pipe[0] < 0, "one SignalWatcher at a time");
  if (::pipe2(g_signal_pipe, O_CLOEXEC | O_NONBLOCK) != 0)
    throw runtime_error(std::string("pipe: ") + std::strerror(errno));
  struct sigaction sa{};
  sa.sa_handler = on_signal;
  sigemptyset(&sa.sa_mask);
  sa.sa_flags = SA_RESTART;
  for (size_t i = 0; i < sizeof kWatched / sizeof kWatched[0]; ++i) ::sigaction(kWatched[i], &sa, &g_previous[i]);
  struct sigaction ign{};
  ign.sa_handler = SIG_IGN;
  sigemptyset(&ign.sa_mask);
  ::sigaction(SIGPIPE, &ign, &g_previous_pipe);
}

SignalWatcher::~SignalWatcher() {
  for (size_t i = 0; i < sizeof kWatched / sizeof kWatched[0]; ++i) ::sigaction(kWatched[i], &g_previous[i], nullptr);
  ::sigaction(SIGPIPE, &g_previous_pipe, nullptr);
  ::close(g_signal_pipe[0]);
  ::close(g_signal_pipe[1]);
  g_signal_pipe[0] = g_signal_pipe[1] = -1;
}

int SignalWatcher::fd() const { return g_signal_pipe[0]; }

std::vector<int> SignalWatcher::take() {
  std::vector<int> got;
  unsigned char buf[64];
  for (;;) {
    ssize_t n = ::read(g_signal_pipe[0], buf, sizeof buf);
    if (n < 0 && errno == EINTR) continue;
    if (n <= 0) break;
    for (ssize_t i = 0; i < n; ++i)
      if (buf[i] != SIGCHLD) got.push_back(buf[i]);
  }
  return got;
}

}  // namespace tessera::launch
