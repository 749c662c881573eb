#include "tessera/comm/local_ranks.h"

#include <errno.h>
#include <fcntl.h>
#include <signal.h>
#include <sys/prctl.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <fstream>
#include <random>
#include <sstream>
#include <thread>

#include "tessera/comm/store.h"
#include "tessera/core/error.h"

namespace tessera {

namespace {

using Clock = std::chrono::steady_clock;

std::string read_file_text(const std::string& path) {
  std::ifstream f(path, std::ios::binary);
  std::stringstream ss;
  ss << f.rdbuf();
  return ss.str();
}

bool read_exact(int fd, void* p, size_t n) {
  auto* c = static_cast<char*>(p);
  while (n > 0) {
    ssize_t r = ::read(fd, c, n);
    if (r < 0 && errno == EINTR) continue;
    if (r <= 0) return false;
    c += r;
    n -= static_cast<size_t>(r);
  }
  return true;
}

[[noreturn]] void child_main(int rank, const LocalRanksOptions& o, int port_pipe, const std::string& token,
                             const std::string& out_path, const std::function<int(int)>& body) {
  ::prctl(PR_SET_PDEATHSIG, SIGKILL);
  if (!out_path.empty()) {
    int fd = ::open(out_path.c_str(), O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0600);
    if (fd >= 0) {
      ::dup2(fd, STDOUT_FILENO);
      ::dup2(fd, STDERR_FILENO);
      ::close(fd);
    }
  }
  int code = 1;
  try {
    int port = 0;
    if (!read_exact(port_pipe, &port, sizeof(port))) {
      std::fprintf(stderr, "error: rank %d: the parent did not send the store port\n", rank);
      std::fflush(nullptr);
      ::_exit(1);
    }
    ::close(port_pipe);
    if (o.child_setup) o.child_setup(rank);
    auto set = [](const char* k, const std::string& v) { ::setenv(k, v.c_str(), 1); };
    set("RANK", std::to_string(rank));
    set("LOCAL_RANK", std::to_string(rank));
    set("WORLD_SIZE", std::to_string(o.world_size));
    set("LOCAL_WORLD_SIZE", std::to_string(o.world_size));
    set("GROUP_RANK", "0");
    set("GROUP_WORLD_SIZE", "1");
    set("MASTER_ADDR", o.master_addr);
    if (port > 0) set("MASTER_PORT", std::to_string(port));
    if (o.serve_store) set("TESSERA_LAUNCHER", "local");
    set("TESSERA_JOB_TOKEN", token);
    code = body(rank);
  } catch (const Error& e) {
    std::fprintf(stderr, "error: %s\n", e.what());
    if (!e.hint().empty()) std::fprintf(stderr, "hint: %s\n", e.hint().c_str());
    code = e.exit_code();
  } catch (const std::exception& e) {
    std::fprintf(stderr, "error: %s\n", e.what());
    code = 1;
  }
  std::fflush(nullptr);
  ::_exit(code);
}

}  // namespace

std::vector<LocalRankResult> run_local_ranks(const LocalRanksOptions& o, const std::function<int(int)>& body) {
  TESSERA_CHECK(o.world_size >= 1, "run_local_ranks: world_size must be at least 1");
  std::mt19937_64 rng(std::random_device{}());
  char token[40];
  std::snprintf(token, sizeof(token), "local-%016llx", static_cast<unsigned long long>(rng()));
  char dir_template[] = "/tmp/tessera-ranks-XXXXXX";
  std::string dir;
  if (o.capture_output) {
    if (!::mkdtemp(dir_template)) throw runtime_error("cannot create a temporary directory in /tmp");
    dir = dir_template;
  }
  std::fflush(nullptr);  // nothing buffered may be written twice

  std::vector<pid_t> pids(o.world_size, -1);
  std::vector<int> pipes(o.world_size, -1);
  std::vector<std::string> out_paths(o.world_size);
  for (int r = 0; r < o.world_size; ++r) {
    int fds[2];
    if (::pipe2(fds, O_CLOEXEC) != 0) throw runtime_error("cannot create a pipe");
    if (o.capture_output) out_paths[r] = dir + "/rank" + std::to_string(r) + ".log";
    pid_t pid = ::fork();
    if (pid < 0) throw runtime_error("cannot fork rank " + std::to_string(r));
    if (pid == 0) {
      ::close(fds[1]);
      for (int q = 0; q < r; ++q) ::close(pipes[q]);
      child_main(r, o, fds[0], token, out_paths[r], body);
    }
    ::close(fds[0]);
    pids[r] = pid;
    pipes[r] = fds[1];
  }

  std::unique_ptr<TcpStoreServer> server;
  int port = 0;
  std::string server_error;
  try {
    if (o.serve_store) {
      server = std::make_unique<TcpStoreServer>(0, token);
      port = server->port();
    }
  } catch (const std::exception& e) {
    server_error = e.what();
  }
  for (int r = 0; r < o.world_size; ++r) {
    if (server_error.empty()) {
      [[maybe_unused]] ssize_t n = ::write(pipes[r], &port, sizeof(port));
    }
    ::close(pipes[r]);
  }

  std::vector<LocalRankResult> results(o.world_size);
  const auto deadline = Clock::now() + o.timeout;
  int left = o.world_size;
  bool killed = false;
  while (left > 0) {
    for (int r = 0; r < o.world_size; ++r) {
      if (pids[r] <= 0) continue;
      int status = 0;
      pid_t pid = ::waitpid(pids[r], &status, WNOHANG);
      if (pid == 0 || (pid < 0 && errno == EINTR)) continue;
      if (pid > 0) {
        if (WIFEXITED(status)) results[r].exit_code = WEXITSTATUS(status);
        if (WIFSIGNALED(status)) results[r].term_signal = WTERMSIG(status);
      }
      pids[r] = -1;
      --left;
    }
    if (left == 0) break;
    if (!killed && Clock::now() >= deadline) {
      for (int r = 0; r < o.world_size; ++r)
        if (pids[r] > 0) {
          results[r].timed_out = true;
          ::kill(pids[r], SIGKILL);
        }
      killed = true;
    }
    std::this_thread::sleep_for(std::chrono::milliseconds(5));
  }
  server.reset();
  for (int r = 0; r < o.world_size; ++r) {
    results[r].rank = r;
    if (o.capture_output) {
      results[r].output = read_file_text(out_paths[r]);
      ::unlink(out_paths[r].c_str());
    }
  }
  if (o.capture_output) ::rmdir(dir.c_str());
  if (!server_error.empty()) throw runtime_error("run_local_ranks: " + server_error);
  return results;
}

std::string describe_failures(const std::vector<LocalRankResult>& results) {
  std::string s;
  for (const auto& r : results) {
    if (r.exit_code == 0 && !r.timed_out) continue;
    s += "rank " + std::to_string(r.rank) + ": ";
    if (r.timed_out) s += "killed after the timeout";
    else if (r.term_signal) s += "killed by signal " + std::to_string(r.term_signal);
    else s += "exit " + std::to_string(r.exit_code);
    s += "\n" + r.output + "\n";
  }
  return s;
}

}  // namespace tessera
