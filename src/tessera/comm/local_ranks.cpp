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

// The variables of `tessera launch`'s contract (launch/worker_env.h) for one rank on this node.
void set_rank_environment(int rank, const LocalRanksOptions& o, int store_port, const std::string& token) {
  auto set = [](const char* k, const std::string& v) { ::setenv(k, v.c_str(), 1); };
  set("RANK", std::to_string(rank));
  set("LOCAL_RANK", std::to_string(rank));
  set("WORLD_SIZE", std::to_string(o.world_size));
  set("LOCAL_WORLD_SIZE", std::to_string(o.world_size));
  set("GROUP_RANK", "0");
  set("GROUP_WORLD_SIZE", "1");
  set("MASTER_ADDR", o.master_addr);
  if (store_port > 0) set("MASTER_PORT", std::to_string(store_port));
  if (o.serve_store) set("TESSERA_LAUNCHER", "local");
  set("TESSERA_JOB_TOKEN", token);
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
    set_rank_environment(rank, o, port, token);
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

// A token no other job on this machine guesses, so that none joins this one's store by mistake.
std::string random_job_token() {
  std::mt19937_64 rng(std::random_device{}());
  char token[40];
  std::snprintf(token, sizeof(token), "local-%016llx", static_cast<unsigned long long>(rng()));
  return token;
}

// The forked ranks, each waiting on its pipe for the store port before it runs the body.
struct ForkedRanks {
  std::vector<pid_t> pids;
  std::vector<int> port_pipes;  // write ends
};

ForkedRanks fork_ranks(const LocalRanksOptions& o, const std::string& token, const std::vector<std::string>& out_paths,
                       const std::function<int(int)>& body) {
  std::fflush(nullptr);  // nothing buffered may be written twice
  ForkedRanks f{std::vector<pid_t>(o.world_size, -1), std::vector<int>(o.world_size, -1)};
  for (int r = 0; r < o.world_size; ++r) {
    int fds[2];
    if (::pipe2(fds, O_CLOEXEC) != 0) throw runtime_error("cannot create a pipe");
    pid_t pid = ::fork();
    if (pid < 0) throw runtime_error("cannot fork rank " + std::to_string(r));
    if (pid == 0) {
      ::close(fds[1]);
      for (int q = 0; q < r; ++q) ::close(f.port_pipes[q]);
      child_main(r, o, fds[0], token, out_paths[r], body);
    }
    ::close(fds[0]);
    f.pids[r] = pid;
    f.port_pipes[r] = fds[1];
  }
  return f;
}

// Starts the store (with serve_store) and tells every rank its port; returns the server and the
// error that kept it from starting ("" if none), in which case the ranks hear nothing and fail.
std::pair<std::unique_ptr<TcpStoreServer>, std::string> serve_store(const LocalRanksOptions& o,
                                                                    const std::string& token,
                                                                    const std::vector<int>& port_pipes) {
  std::unique_ptr<TcpStoreServer> server;
  int port = 0;
  std::string error;
  try {
    if (o.serve_store) {
      server = std::make_unique<TcpStoreServer>(0, token);
      port = server->port();
    }
  } catch (const std::exception& e) {
    error = e.what();
  }
  for (int fd : port_pipes) {
    if (error.empty()) {
      [[maybe_unused]] ssize_t n = ::write(fd, &port, sizeof(port));
    }
    ::close(fd);
  }
  return {std::move(server), std::move(error)};
}

// Reaps every rank, killing those still running at the timeout; fills exit code, signal and
// timed_out of `results`.
void wait_for_ranks(const LocalRanksOptions& o, std::vector<pid_t> pids, std::vector<LocalRankResult>& results) {
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
}

}  // namespace

std::vector<LocalRankResult> run_local_ranks(const LocalRanksOptions& o, const std::function<int(int)>& body) {
  TESSERA_CHECK(o.world_size >= 1, "run_local_ranks: world_size must be at least 1");
  const std::string token = random_job_token();
  std::string dir;
  std::vector<std::string> out_paths(o.world_size);
  if (o.capture_output) {
    char dir_template[] = "/tmp/tessera-ranks-XXXXXX";
    if (!::mkdtemp(dir_template)) throw runtime_error("cannot create a temporary directory in /tmp");
    dir = dir_template;
    for (int r = 0; r < o.world_size; ++r) out_paths[r] = dir + "/rank" + std::to_string(r) + ".log";
  }

  const ForkedRanks ranks = fork_ranks(o, token, out_paths, body);
  auto [server, server_error] = serve_store(o, token, ranks.port_pipes);
  std::vector<LocalRankResult> results(o.world_size);
  wait_for_ranks(o, ranks.pids, results);
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
