// The TCP rendezvous store: server, client, and the in-process store.
//
// Wire format (every integer little-endian). A message is a u32 byte count and that many
// bytes: a u8 opcode, then the fields of the op. A string or a value is a u32 length and its
// bytes. The first message of a connection is HELLO; the server answers every request with
// one reply: a u8 status (kOk, kTimeout, kFailed) and the fields of the answer.
//
//   HELLO  u32 magic, u32 version, str token        -> ok | failed str reason
//   SET    str key, bytes value                      -> ok
//   GET    str key, u32 timeout_ms                   -> ok bytes value | timeout
//   ADD    str key, i64 delta                        -> ok i64 result | failed str reason
//   CHECK  u32 n, n x str key                        -> ok u8 all_present
//   WAIT   u32 n, n x str key, u32 timeout_ms        -> ok | timeout u32 m, m x str missing
//
// ADD keeps its integer as decimal text, so `get` of a counter reads "3" (as in PyTorch's
// TCPStore). The server runs one thread per connection; waits block on a condition variable.
#include <arpa/inet.h>
#include <fcntl.h>
#include <netdb.h>
#include <netinet/tcp.h>
#include <poll.h>
#include <sys/socket.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <cerrno>
#include <condition_variable>
#include <cstdlib>
#include <cstring>
#include <list>
#include <map>
#include <mutex>
#include <thread>

#include "tessera/comm/socket_util.h"
#include "tessera/comm/store.h"
#include "tessera/core/error.h"
#include "tessera/core/log.h"

namespace tessera {

using namespace comm_detail;
using std::chrono::milliseconds;

namespace {

constexpr uint32_t kMagic = 0x31535354;  // "TSS1"
constexpr uint32_t kVersion = 1;
constexpr uint32_t kMaxMessage = 256u << 20;  // no legitimate message comes near this
constexpr uint32_t kMaxHello = 64 << 10;     // so a stray client (an HTTP probe) is dropped at once
constexpr auto kHandshakeTimeout = std::chrono::seconds(10);
// A client waits this much longer than the server-side wait for the answer, so that a slow
// network never turns a store answer into a client-side timeout.
constexpr auto kReplySlack = std::chrono::seconds(30);

enum Op : uint8_t { kHello = 1, kSet = 2, kGet = 3, kAdd = 4, kCheck = 5, kWait = 6 };
enum Status : uint8_t { kOk = 0, kTimeout = 1, kFailed = 2 };

// ---- encoding ---------------------------------------------------------------------------------

struct Writer {
  std::vector<uint8_t> buf = std::vector<uint8_t>(4, 0);  // room for the length prefix
  void u8(uint8_t v) { buf.push_back(v); }
  void u32(uint32_t v) {
    for (int i = 0; i < 4; ++i) buf.push_back(static_cast<uint8_t>(v >> (8 * i)));
  }
  void i64(int64_t v) {
    auto u = static_cast<uint64_t>(v);
    for (int i = 0; i < 8; ++i) buf.push_back(static_cast<uint8_t>(u >> (8 * i)));
  }
  void bytes(const void* p, size_t n) {
    u32(static_cast<uint32_t>(n));
    auto* c = static_cast<const uint8_t*>(p);
    buf.insert(buf.end(), c, c + n);
  }
  void str(const std::string& s) { bytes(s.data(), s.size()); }
  // The finished message with its length prefix.
  const std::vector<uint8_t>& finish() {
    uint32_t n = static_cast<uint32_t>(buf.size() - 4);
    for (int i = 0; i < 4; ++i) buf[i] = static_cast<uint8_t>(n >> (8 * i));
    return buf;
  }
};

// Bounds-checked reading of one message; `ok` turns false on the first overrun.
struct Reader {
  const uint8_t* p;
  size_t left;
  bool ok = true;
  bool take(size_t n) {
    if (!ok || left < n) return ok = false;
    return true;
  }
  uint8_t u8() {
    if (!take(1)) return 0;
    --left;
    return *p++;
  }
  uint32_t u32() {
    if (!take(4)) return 0;
    uint32_t v = 0;
    for (int i = 0; i < 4; ++i) v |= static_cast<uint32_t>(p[i]) << (8 * i);
    p += 4, left -= 4;
    return v;
  }
  int64_t i64() {
    if (!take(8)) return 0;
    uint64_t v = 0;
    for (int i = 0; i < 8; ++i) v |= static_cast<uint64_t>(p[i]) << (8 * i);
    p += 8, left -= 8;
    return static_cast<int64_t>(v);
  }
  std::vector<uint8_t> bytes() {
    uint32_t n = u32();
    if (!take(n)) return {};
    std::vector<uint8_t> v(p, p + n);
    p += n, left -= n;
    return v;
  }
  std::string str() {
    auto v = bytes();
    return std::string(v.begin(), v.end());
  }
};

// Reads one length-prefixed message into `out`.
IoStatus recv_message(int fd, std::vector<uint8_t>& out, Clock::time_point deadline, int* err,
                      uint32_t max_bytes = kMaxMessage) {
  uint8_t len_bytes[4];
  IoStatus st = recv_all(fd, len_bytes, 4, deadline, err);
  if (st != IoStatus::Ok) return st;
  uint32_t n = 0;
  for (int i = 0; i < 4; ++i) n |= static_cast<uint32_t>(len_bytes[i]) << (8 * i);
  if (n > max_bytes) {
    *err = EMSGSIZE;
    return IoStatus::Error;
  }
  out.resize(n);
  return recv_all(fd, out.data(), n, deadline, err);
}

Clock::time_point deadline_after(milliseconds timeout) {
  if (timeout.count() < 0) return Clock::time_point::max();
  return Clock::now() + timeout;
}

uint32_t timeout_ms_field(milliseconds timeout) {
  return static_cast<uint32_t>(std::clamp<int64_t>(timeout.count(), 0, 0x7fffffff));
}

std::string seconds_text(milliseconds t) {
  char buf[32];
  std::snprintf(buf, sizeof(buf), "%g s", static_cast<double>(t.count()) / 1000.0);
  return buf;
}

std::string keys_text(const std::vector<std::string>& keys, size_t max_listed = 8) {
  std::string s;
  for (size_t i = 0; i < keys.size() && i < max_listed; ++i) s += (i ? ", '" : "'") + keys[i] + "'";
  if (keys.size() > max_listed) s += " and " + std::to_string(keys.size() - max_listed) + " more";
  return s;
}

bool parse_int64(const std::vector<uint8_t>& v, int64_t* out) {
  std::string s(v.begin(), v.end());
  if (s.empty()) return false;
  char* end = nullptr;
  errno = 0;
  long long x = std::strtoll(s.c_str(), &end, 10);
  if (errno != 0 || *end != '\0') return false;
  *out = x;
  return true;
}

std::vector<uint8_t> int_text(int64_t v) {
  std::string s = std::to_string(v);
  return {s.begin(), s.end()};
}

// ---- the key-value table shared by the server and the local store ------------------------------

class Table {
 public:
  void set(const std::string& key, std::vector<uint8_t> value) {
    {
      std::lock_guard<std::mutex> lock(mu_);
      data_[key] = std::move(value);
    }
    cv_.notify_all();
  }
  // Returns false (and leaves *error) when the value is not an integer.
  bool add(const std::string& key, int64_t delta, int64_t* result, std::string* error) {
    {
      std::lock_guard<std::mutex> lock(mu_);
      int64_t v = 0;
      auto it = data_.find(key);
      if (it != data_.end() && !parse_int64(it->second, &v)) {
        *error = "key '" + key + "' holds a value that is not an integer";
        return false;
      }
      v += delta;
      data_[key] = int_text(v);
      *result = v;
    }
    cv_.notify_all();
    return true;
  }
  bool check(const std::vector<std::string>& keys) {
    std::lock_guard<std::mutex> lock(mu_);
    return missing_locked(keys).empty();
  }
  // Waits until every key exists, the deadline passes or the table stops. Returns the keys
  // still missing (empty: all present); *stopped tells a shutdown apart from a timeout.
  std::vector<std::string> wait(const std::vector<std::string>& keys, Clock::time_point deadline, bool* stopped,
                                std::vector<uint8_t>* first_value = nullptr) {
    std::unique_lock<std::mutex> lock(mu_);
    auto ready = [&] { return stopping_ || missing_locked(keys).empty(); };
    if (deadline == Clock::time_point::max()) cv_.wait(lock, ready);
    else cv_.wait_until(lock, deadline, ready);
    *stopped = stopping_;
    auto missing = missing_locked(keys);
    if (missing.empty() && first_value && !keys.empty()) *first_value = data_[keys[0]];
    return missing;
  }
  void stop() {
    {
      std::lock_guard<std::mutex> lock(mu_);
      stopping_ = true;
    }
    cv_.notify_all();
  }

 private:
  std::vector<std::string> missing_locked(const std::vector<std::string>& keys) const {
    std::vector<std::string> missing;
    for (const auto& k : keys)
      if (!data_.count(k)) missing.push_back(k);
    return missing;
  }
  std::mutex mu_;
  std::condition_variable cv_;
  std::map<std::string, std::vector<uint8_t>> data_;
  bool stopping_ = false;
};

Error wait_timeout_error(const std::vector<std::string>& missing, milliseconds timeout, const std::string& where) {
  return runtime_error("timed out after " + seconds_text(timeout) + " waiting for " + keys_text(missing) + " in " +
                           where,
                       "the ranks that publish these keys have not reached this point: check that every node of "
                       "the job has started, that all use the same MASTER_ADDR, MASTER_PORT and job, and the "
                       "output of the other ranks for an earlier error");
}

// ---- local store ----------------------------------------------------------------------------------

class LocalStore final : public Store {
 public:
  explicit LocalStore(milliseconds timeout) : timeout_(timeout) {}
  void set(const std::string& key, const std::vector<uint8_t>& value) override { table_.set(key, value); }
  std::vector<uint8_t> get(const std::string& key) override {
    bool stopped = false;
    std::vector<uint8_t> value;
    auto missing = table_.wait({key}, deadline_after(timeout_), &stopped, &value);
    if (!missing.empty()) throw wait_timeout_error(missing, timeout_, "the in-process store");
    return value;
  }
  int64_t add(const std::string& key, int64_t delta) override {
    int64_t result = 0;
    std::string error;
    if (!table_.add(key, delta, &result, &error)) throw runtime_error("store add: " + error);
    return result;
  }
  bool check(const std::vector<std::string>& keys) override { return table_.check(keys); }
  void wait(const std::vector<std::string>& keys, milliseconds timeout) override {
    bool stopped = false;
    auto missing = table_.wait(keys, deadline_after(timeout), &stopped);
    if (!missing.empty()) throw wait_timeout_error(missing, timeout, "the in-process store");
  }
  milliseconds timeout() const override { return timeout_; }

 private:
  milliseconds timeout_;
  Table table_;
};

}  // namespace

// ---- server ---------------------------------------------------------------------------------------

struct TcpStoreServer::Impl {
  int port = 0;
  std::string token;
  Fd listen_fd;
  Fd wake_read, wake_write;  // a pipe that wakes the accept loop on shutdown
  Table table;
  std::thread accept_thread;

  struct Connection {
    Fd fd;
    std::string peer;
    std::thread thread;
    std::atomic<bool> done{false};
  };
  std::mutex connections_mu;
  std::list<std::unique_ptr<Connection>> connections;
  bool stopping = false;  // guarded by connections_mu

  void accept_loop();
  void serve(Connection* c);
  bool handle(Connection* c, Reader& r, Writer& w);
  void reap_finished();
};

TcpStoreServer::TcpStoreServer(int port, std::string job_token) : impl_(std::make_unique<Impl>()) {
  impl_->token = std::move(job_token);
  const std::string what_port = "port " + std::to_string(port);
  Fd fd(::socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0));
  if (!fd.valid()) throw runtime_error("cannot create a socket for tessera's rendezvous store: " + errno_text(errno));
  int one = 1;
  ::setsockopt(fd.get(), SOL_SOCKET, SO_REUSEADDR, &one, sizeof(one));
  sockaddr_in addr{};
  addr.sin_family = AF_INET;
  addr.sin_addr.s_addr = htonl(INADDR_ANY);
  addr.sin_port = htons(static_cast<uint16_t>(port));
  if (::bind(fd.get(), reinterpret_cast<sockaddr*>(&addr), sizeof(addr)) != 0) {
    int err = errno;
    if (err == EADDRINUSE)
      throw runtime_error("cannot serve tessera's rendezvous store on " + what_port + ": " + errno_text(err),
                          "another program, another job or a previous run that has not exited holds the port: "
                          "choose another --master_port (or TESSERA_STORE_PORT); on one node, `tessera launch "
                          "--standalone` binds a free port itself; find the holder with `ss -ltnp 'sport = :" +
                              std::to_string(port) + "'`");
    throw runtime_error("cannot serve tessera's rendezvous store on " + what_port + ": " + errno_text(err),
                        err == EACCES ? "ports below 1024 need privileges: choose a port above 1024" : "");
  }
  if (::listen(fd.get(), 1024) != 0)
    throw runtime_error("cannot listen on " + what_port + " for tessera's rendezvous store: " + errno_text(errno));
  socklen_t len = sizeof(addr);
  ::getsockname(fd.get(), reinterpret_cast<sockaddr*>(&addr), &len);
  impl_->port = ntohs(addr.sin_port);
  impl_->listen_fd = std::move(fd);

  int pipe_fds[2];
  if (::pipe2(pipe_fds, O_CLOEXEC) != 0) throw runtime_error("cannot create a pipe: " + errno_text(errno));
  impl_->wake_read.reset(pipe_fds[0]);
  impl_->wake_write.reset(pipe_fds[1]);
  impl_->accept_thread = std::thread([impl = impl_.get()] { impl->accept_loop(); });
}

TcpStoreServer::~TcpStoreServer() {
  Impl& s = *impl_;
  {
    std::lock_guard<std::mutex> lock(s.connections_mu);
    s.stopping = true;
    for (auto& c : s.connections) ::shutdown(c->fd.get(), SHUT_RDWR);  // wakes blocked reads
  }
  s.table.stop();  // wakes waits
  char byte = 0;
  [[maybe_unused]] ssize_t n = ::write(s.wake_write.get(), &byte, 1);
  if (s.accept_thread.joinable()) s.accept_thread.join();
  // No new connection can appear now; join the ones that remain.
  for (auto& c : s.connections)
    if (c->thread.joinable()) c->thread.join();
}

int TcpStoreServer::port() const { return impl_->port; }

void TcpStoreServer::Impl::reap_finished() {
  std::lock_guard<std::mutex> lock(connections_mu);
  for (auto it = connections.begin(); it != connections.end();) {
    if ((*it)->done.load()) {
      (*it)->thread.join();
      it = connections.erase(it);
    } else {
      ++it;
    }
  }
}

void TcpStoreServer::Impl::accept_loop() {
  while (true) {
    pollfd fds[2] = {{listen_fd.get(), POLLIN, 0}, {wake_read.get(), POLLIN, 0}};
    int r = ::poll(fds, 2, 1000);
    if (r < 0 && errno != EINTR) break;
    if (fds[1].revents) break;
    reap_finished();
    if (r <= 0 || !(fds[0].revents & POLLIN)) continue;
    sockaddr_storage peer{};
    socklen_t len = sizeof(peer);
    int cfd = ::accept4(listen_fd.get(), reinterpret_cast<sockaddr*>(&peer), &len, SOCK_CLOEXEC);
    if (cfd < 0) continue;  // the peer went away between poll and accept, or EMFILE: try again
    int one = 1;
    ::setsockopt(cfd, IPPROTO_TCP, TCP_NODELAY, &one, sizeof(one));
    auto c = std::make_unique<Connection>();
    c->fd.reset(cfd);
    c->peer = sockaddr_text(reinterpret_cast<sockaddr*>(&peer));
    std::lock_guard<std::mutex> lock(connections_mu);
    if (stopping) break;
    Connection* raw = c.get();
    connections.push_back(std::move(c));
    raw->thread = std::thread([this, raw] {
      serve(raw);
      // The peer sees the end now; the descriptor itself is closed when the thread is reaped.
      ::shutdown(raw->fd.get(), SHUT_RDWR);
      raw->done = true;
    });
  }
}

void TcpStoreServer::Impl::serve(Connection* c) {
  const int fd = c->fd.get();
  std::vector<uint8_t> msg;
  int err = 0;
  // Handshake: HELLO with the job token, within kHandshakeTimeout.
  if (recv_message(fd, msg, Clock::now() + kHandshakeTimeout, &err, kMaxHello) != IoStatus::Ok) {
    if (err == EMSGSIZE)
      log_warn("tessera store on port %d: dropped a connection from %s that is not a tessera store client", port,
               c->peer.c_str());
    return;
  }
  {
    Reader r{msg.data(), msg.size()};
    uint8_t op = r.u8();
    uint32_t magic = r.u32();
    uint32_t version = r.u32();
    std::string peer_token = r.str();
    if (!r.ok || op != kHello || magic != kMagic) {
      log_warn("tessera store on port %d: dropped a connection from %s that is not a tessera store client", port,
               c->peer.c_str());
      return;
    }
    Writer w;
    if (version != kVersion) {
      w.u8(kFailed);
      w.str("protocol version " + std::to_string(version) + " is not this store's (" + std::to_string(kVersion) +
            "): every node must run the same tessera build");
    } else if (peer_token != token) {
      log_warn("tessera store on port %d: rejected a connection from %s: job token mismatch (a process of another "
               "job, or nodes that disagree on TESSERA_JOB_TOKEN / the run id)",
               port, c->peer.c_str());
      w.u8(kFailed);
      w.str("job token mismatch");
    } else {
      w.u8(kOk);
    }
    const auto& out = w.finish();
    if (send_all(fd, out.data(), out.size(), &err) != IoStatus::Ok || w.buf[4] != kOk) return;
  }
  while (true) {
    if (recv_message(fd, msg, Clock::time_point::max(), &err) != IoStatus::Ok) return;
    Reader r{msg.data(), msg.size()};
    Writer w;
    if (!handle(c, r, w)) {
      log_warn("tessera store on port %d: dropped %s after a malformed request", port, c->peer.c_str());
      return;
    }
    const auto& out = w.finish();
    if (send_all(fd, out.data(), out.size(), &err) != IoStatus::Ok) return;
  }
}

bool TcpStoreServer::Impl::handle(Connection* c, Reader& r, Writer& w) {
  uint8_t op = r.u8();
  auto read_keys = [&r] {
    std::vector<std::string> keys(std::min<uint32_t>(r.u32(), 1u << 20));
    for (auto& k : keys) k = r.str();
    return keys;
  };
  auto stopped_reply = [&] {
    w.u8(kFailed);
    w.str("the store is shutting down (the process that serves it is exiting)");
  };
  switch (op) {
    case kSet: {
      std::string key = r.str();
      auto value = r.bytes();
      if (!r.ok) return false;
      table.set(key, std::move(value));
      w.u8(kOk);
      return true;
    }
    case kGet: {
      std::string key = r.str();
      uint32_t timeout_ms = r.u32();
      if (!r.ok) return false;
      bool stopped = false;
      std::vector<uint8_t> value;
      auto missing = table.wait({key}, Clock::now() + milliseconds(timeout_ms), &stopped, &value);
      if (missing.empty()) {
        w.u8(kOk);
        w.bytes(value.data(), value.size());
      } else if (stopped) {
        stopped_reply();
      } else {
        w.u8(kTimeout);
      }
      return true;
    }
    case kAdd: {
      std::string key = r.str();
      int64_t delta = r.i64();
      if (!r.ok) return false;
      int64_t result = 0;
      std::string error;
      if (table.add(key, delta, &result, &error)) {
        w.u8(kOk);
        w.i64(result);
      } else {
        w.u8(kFailed);
        w.str(error);
      }
      return true;
    }
    case kCheck: {
      auto keys = read_keys();
      if (!r.ok) return false;
      w.u8(kOk);
      w.u8(table.check(keys) ? 1 : 0);
      return true;
    }
    case kWait: {
      auto keys = read_keys();
      uint32_t timeout_ms = r.u32();
      if (!r.ok) return false;
      bool stopped = false;
      auto missing = table.wait(keys, Clock::now() + milliseconds(timeout_ms), &stopped);
      if (missing.empty()) {
        w.u8(kOk);
      } else if (stopped) {
        stopped_reply();
      } else {
        w.u8(kTimeout);
        w.u32(static_cast<uint32_t>(missing.size()));
        for (const auto& k : missing) w.str(k);
      }
      return true;
    }
    default:
      (void)c;
      return false;
  }
}

// ---- client ---------------------------------------------------------------------------------------

namespace {

const char* kReachHint =
    "the store is served by `tessera launch` on node 0 (or by global rank 0 under torchrun or Slurm): check "
    "that it is running, that MASTER_ADDR is node 0's address as seen from this node (ping it), that no "
    "firewall blocks the TCP port, and that no other program holds the port";

class TcpStoreClient final : public Store {
 public:
  TcpStoreClient(std::string host, int port, Fd fd, milliseconds timeout)
      : where_("tessera's rendezvous store at " + host + ":" + std::to_string(port)),
        fd_(std::move(fd)),
        timeout_(timeout) {}

  void set(const std::string& key, const std::vector<uint8_t>& value) override {
    Writer w;
    w.u8(kSet);
    w.str(key);
    w.bytes(value.data(), value.size());
    auto reply = request(w, milliseconds(0), "set");
    expect_ok(reply, "set");
  }

  std::vector<uint8_t> get(const std::string& key) override {
    Writer w;
    w.u8(kGet);
    w.str(key);
    w.u32(timeout_ms_field(timeout_));
    auto reply = request(w, timeout_, "get");
    Reader r{reply.data(), reply.size()};
    uint8_t status = r.u8();
    if (status == kTimeout) throw wait_timeout_error({key}, timeout_, where_);
    if (status != kOk) fail(r, "get");
    auto value = r.bytes();
    if (!r.ok) malformed("get");
    return value;
  }

  int64_t add(const std::string& key, int64_t delta) override {
    Writer w;
    w.u8(kAdd);
    w.str(key);
    w.i64(delta);
    auto reply = request(w, milliseconds(0), "add");
    Reader r{reply.data(), reply.size()};
    if (r.u8() != kOk) fail(r, "add");
    int64_t v = r.i64();
    if (!r.ok) malformed("add");
    return v;
  }

  bool check(const std::vector<std::string>& keys) override {
    Writer w;
    w.u8(kCheck);
    w.u32(static_cast<uint32_t>(keys.size()));
    for (const auto& k : keys) w.str(k);
    auto reply = request(w, milliseconds(0), "check");
    Reader r{reply.data(), reply.size()};
    if (r.u8() != kOk) fail(r, "check");
    uint8_t v = r.u8();
    if (!r.ok) malformed("check");
    return v != 0;
  }

  void wait(const std::vector<std::string>& keys, milliseconds timeout) override {
    Writer w;
    w.u8(kWait);
    w.u32(static_cast<uint32_t>(keys.size()));
    for (const auto& k : keys) w.str(k);
    w.u32(timeout_ms_field(timeout));
    auto reply = request(w, timeout, "wait");
    Reader r{reply.data(), reply.size()};
    uint8_t status = r.u8();
    if (status == kOk) return;
    if (status != kTimeout) fail(r, "wait");
    std::vector<std::string> missing(std::min<uint32_t>(r.u32(), 1u << 20));
    for (auto& k : missing) k = r.str();
    if (!r.ok) malformed("wait");
    throw wait_timeout_error(missing, timeout, where_);
  }

  milliseconds timeout() const override { return timeout_; }

 private:
  // Sends one request and reads its reply; `server_wait` is how long the server may wait.
  std::vector<uint8_t> request(Writer& w, milliseconds server_wait, const char* op) {
    std::lock_guard<std::mutex> lock(mu_);
    if (!fd_.valid()) throw lost(op, "an earlier request failed");
    const auto& out = w.finish();
    int err = 0;
    IoStatus st = send_all(fd_.get(), out.data(), out.size(), &err);
    std::vector<uint8_t> reply;
    if (st == IoStatus::Ok) st = recv_message(fd_.get(), reply, Clock::now() + server_wait + kReplySlack, &err);
    if (st == IoStatus::Ok) return reply;
    fd_.reset();
    if (st == IoStatus::Closed) throw lost(op, "the connection was closed");
    if (st == IoStatus::Timeout) throw lost(op, "no answer");
    throw lost(op, errno_text(err));
  }

  Error lost(const char* op, const std::string& why) const {
    return runtime_error("lost " + where_ + " during " + op + ": " + why,
                         "the process that serves the store (the launcher on node 0, or global rank 0) has "
                         "probably exited or been killed: look at its output for the first error");
  }
  [[noreturn]] void fail(Reader& r, const char* op) const {
    std::string reason = r.str();
    throw runtime_error(where_ + " refused " + op + ": " + (r.ok ? reason : "malformed answer"));
  }
  [[noreturn]] void malformed(const char* op) const {
    throw runtime_error(where_ + " sent a malformed answer to " + op,
                        "every node must run the same tessera build");
  }
  void expect_ok(const std::vector<uint8_t>& reply, const char* op) const {
    Reader r{reply.data(), reply.size()};
    if (r.u8() != kOk) fail(r, op);
  }

  std::string where_;
  Fd fd_;
  milliseconds timeout_;
  std::mutex mu_;
};

// One non-blocking connect attempt bounded by `deadline`. Returns the fd or -1 with *err.
int connect_once(const addrinfo* ai, Clock::time_point deadline, int* err) {
  Fd fd(::socket(ai->ai_family, ai->ai_socktype | SOCK_CLOEXEC | SOCK_NONBLOCK, ai->ai_protocol));
  if (!fd.valid()) {
    *err = errno;
    return -1;
  }
  if (::connect(fd.get(), ai->ai_addr, ai->ai_addrlen) != 0) {
    if (errno != EINPROGRESS) {
      *err = errno;
      return -1;
    }
    auto left = std::chrono::duration_cast<milliseconds>(deadline - Clock::now()).count();
    pollfd pfd{fd.get(), POLLOUT, 0};
    int r = ::poll(&pfd, 1, static_cast<int>(std::clamp<long long>(left, 0, 5000)));
    if (r <= 0) {
      *err = r == 0 ? ETIMEDOUT : errno;
      return -1;
    }
    int so_error = 0;
    socklen_t len = sizeof(so_error);
    ::getsockopt(fd.get(), SOL_SOCKET, SO_ERROR, &so_error, &len);
    if (so_error != 0) {
      *err = so_error;
      return -1;
    }
  }
  int flags = ::fcntl(fd.get(), F_GETFL);
  ::fcntl(fd.get(), F_SETFL, flags & ~O_NONBLOCK);
  int one = 1;
  ::setsockopt(fd.get(), IPPROTO_TCP, TCP_NODELAY, &one, sizeof(one));
  return fd.release();
}

}  // namespace

std::unique_ptr<Store> connect_tcp_store(const std::string& host, int port, const std::string& job_token,
                                         milliseconds timeout) {
  const std::string where = "tessera's rendezvous store at " + host + ":" + std::to_string(port);
  const auto deadline = deadline_after(timeout);
  auto backoff = milliseconds(20);
  std::string last_error = "no attempt";
  while (true) {
    addrinfo hints{};
    hints.ai_family = AF_UNSPEC;
    hints.ai_socktype = SOCK_STREAM;
    addrinfo* res = nullptr;
    int gai = ::getaddrinfo(host.c_str(), std::to_string(port).c_str(), &hints, &res);
    if (gai == EAI_NONAME || gai == EAI_SERVICE)
      throw usage_error("cannot connect to " + where + ": '" + host + "' is not a known host name or address (" +
                            gai_strerror(gai) + ")",
                        "set MASTER_ADDR (or --master_addr) to node 0's IP address or resolvable host name");
    if (gai != 0) last_error = std::string("address lookup failed: ") + gai_strerror(gai);
    for (addrinfo* ai = res; ai; ai = ai->ai_next) {
      int err = 0;
      Fd fd(connect_once(ai, deadline, &err));
      if (!fd.valid()) {
        last_error = errno_text(err);
        continue;
      }
      // Handshake.
      Writer w;
      w.u8(kHello);
      w.u32(kMagic);
      w.u32(kVersion);
      w.str(job_token);
      const auto& out = w.finish();
      std::vector<uint8_t> reply;
      IoStatus st = send_all(fd.get(), out.data(), out.size(), &err);
      if (st == IoStatus::Ok) st = recv_message(fd.get(), reply, Clock::now() + kHandshakeTimeout, &err);
      if (st != IoStatus::Ok) {
        last_error = st == IoStatus::Closed    ? "the server closed the connection during the handshake"
                     : st == IoStatus::Timeout ? "no answer to the handshake (is this port a tessera store?)"
                                               : errno_text(err);
        continue;
      }
      Reader r{reply.data(), reply.size()};
      uint8_t status = r.u8();
      if (status != kOk) {
        std::string reason = r.ok ? r.str() : "malformed answer";
        if (reason == "job token mismatch")
          throw runtime_error(where + " rejected this process: job token mismatch (the store belongs to another "
                                  "job, or the nodes of this job derive different tokens)",
                              "if this process belongs to that job, give every node the same TESSERA_JOB_TOKEN "
                              "(or the same --rdzv_id / run id and store port); otherwise choose another "
                              "--master_port for this job");
        throw runtime_error(where + " rejected this process: " + reason);
      }
      ::freeaddrinfo(res);
      return std::make_unique<TcpStoreClient>(host, port, std::move(fd), timeout);
    }
    if (res) ::freeaddrinfo(res);
    if (Clock::now() + backoff >= deadline)
      throw runtime_error("could not connect to " + where + " within " + seconds_text(timeout) + " (last error: " +
                              last_error + ")",
                          kReachHint);
    std::this_thread::sleep_for(backoff);
    backoff = std::min(backoff * 2, milliseconds(1000));
  }
}

std::unique_ptr<Store> make_local_store(milliseconds timeout) { return std::make_unique<LocalStore>(timeout); }

std::string default_job_token() {
  auto env = [](const char* name) -> std::string {
    const char* v = std::getenv(name);
    return v ? v : "";
  };
  if (std::string t = env("TESSERA_JOB_TOKEN"); !t.empty()) return t;
  std::string run_id = env("TORCHELASTIC_RUN_ID");
  if (run_id.empty() && !env("SLURM_JOB_ID").empty()) {
    run_id = env("SLURM_JOB_ID");
    if (!env("SLURM_STEP_ID").empty()) run_id += "." + env("SLURM_STEP_ID");
  }
  if (run_id.empty()) run_id = "none";
  int store_port = 0;
  if (std::string p = env("TESSERA_STORE_PORT"); !p.empty()) store_port = std::atoi(p.c_str());
  else if (std::string m = env("MASTER_PORT"); !m.empty()) store_port = std::atoi(m.c_str()) + 1;
  return "tessera-job:" + run_id + ":" + std::to_string(store_port);
}

}  // namespace tessera
