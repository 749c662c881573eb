#include "tessera/comm/in_process/in_process_communicator.h"

#include <algorithm>
#include <condition_variable>
#include <cstring>
#include <deque>
#include <exception>
#include <map>
#include <mutex>
#include <thread>

#include "tessera/comm/async_queue.h"
#include "tessera/device/cpu/cpu_device.h"
#include "tessera/comm/collective_util.h"
#include "tessera/core/error.h"

namespace tessera {

using std::chrono::milliseconds;
using Clock = std::chrono::steady_clock;
using namespace comm_detail;

namespace comm_detail {

// The shared state of one group: a reusable barrier, the pointers each rank publishes for
// the current collective, p2p mailboxes and the subgroups being built by split.
struct InProcessGroup {
  InProcessGroup(std::string name_, std::vector<int> world_ranks_, milliseconds timeout_)
      : name(std::move(name_)),
        world_ranks(std::move(world_ranks_)),
        size(static_cast<int>(world_ranks.size())),
        timeout(timeout_),
        arrived_flags(size, false),
        in(size, nullptr),
        out(size, nullptr) {}

  const std::string name;
  const std::vector<int> world_ranks;
  const int size;
  const milliseconds timeout;

  std::mutex mu;
  std::condition_variable cv;
  bool broken = false;
  std::string broken_reason;

  // Barrier.
  uint64_t generation = 0;
  int arrived = 0;
  std::string round_call;  // what the first rank of this round called
  int round_first = -1;
  std::vector<bool> arrived_flags;

  // Published by each rank before the first barrier of a collective.
  std::vector<const void*> in;
  std::vector<void*> out;

  // p2p, per ordered pair (src, dst): the posted sends and recvs not matched yet, oldest
  // first. Whoever posts second pops the other side's oldest and copies (FIFO per pair).
  struct P2POp {
    void* data;
    size_t bytes;
    bool done = false;
  };
  struct Mailbox {
    std::deque<P2POp*> sends, recvs;
  };
  std::map<std::pair<int, int>, Mailbox> mailboxes;

  // split: the subgroups of split number k, created by the first rank that gets there.
  struct Split {
    std::vector<std::vector<int>> groups;
    std::vector<std::shared_ptr<InProcessGroup>> subgroups;
    int fetched = 0;
  };
  std::map<int, Split> splits;

  std::string where() const { return group_text(name, world_ranks); }

  [[noreturn]] void throw_broken() const {
    throw runtime_error("in-process communicator on " + where() + " is broken: " + broken_reason);
  }

  // Waits until every rank called barrier with the same `call`; throws naming the ranks that
  // had not arrived after the timeout, or the mismatching calls.
  void barrier(int rank, const std::string& call, std::unique_lock<std::mutex>& lock) {
    if (broken) throw_broken();
    if (arrived == 0) {
      round_call = call;
      round_first = rank;
    } else if (call != round_call) {
      broken = true;
      broken_reason = "world rank " + std::to_string(world_ranks[rank]) + " called " + call + " while world rank " +
                      std::to_string(world_ranks[round_first]) + " called " + round_call;
      cv.notify_all();
      throw runtime_error("collective mismatch on " + where() + ": " + broken_reason,
                          "every rank of a group must issue the same collectives in the same order");
    }
    const uint64_t gen = generation;
    arrived_flags[rank] = true;
    if (++arrived == size) {
      arrived = 0;
      std::fill(arrived_flags.begin(), arrived_flags.end(), false);
      ++generation;
      cv.notify_all();
      return;
    }
    bool done = cv.wait_until(lock, Clock::now() + timeout, [&] { return generation != gen || broken; });
    if (generation != gen) return;
    if (broken) throw_broken();
    (void)done;
    std::vector<int> missing;
    for (int r = 0; r < size; ++r)
      if (!arrived_flags[r]) missing.push_back(world_ranks[r]);
    broken = true;
    broken_reason = call + " timed out";
    cv.notify_all();
    throw runtime_error(call + " on " + where() + " timed out after " + std::to_string(timeout.count()) +
                            " ms: world rank(s) " + ranks_text(missing) + " had not called it",
                        "a rank that does not reach a collective is stuck elsewhere or has failed: look at its "
                        "output; raise --distributed-timeout-minutes only if it is merely slow");
  }
};

}  // namespace comm_detail

namespace {

// One posted send or recv; its op sits in the pair's mailbox until the other side matches it.
class InProcessP2PWork final : public Work {
 public:
  InProcessP2PWork(std::shared_ptr<InProcessGroup> g, std::pair<int, int> pair, bool is_send, const Tensor& t,
                   P2PText text)
      : g_(std::move(g)), pair_(pair), is_send_(is_send), op_{cpu_memory(t), t.bytes()}, text_(std::move(text)) {}

  // The mailbox points at op_: an unwaited Work waits here, then unlinks it.
  ~InProcessP2PWork() override {
    try {
      wait();
    } catch (...) {
    }
  }

  void post() {
    std::lock_guard<std::mutex> lock(g_->mu);
    if (g_->broken) g_->throw_broken();
    waited_ = false;
    auto& box = g_->mailboxes[pair_];
    auto& others = is_send_ ? box.recvs : box.sends;
    if (others.empty()) {
      (is_send_ ? box.sends : box.recvs).push_back(&op_);
      return;
    }
    InProcessGroup::P2POp* other = others.front();
    others.pop_front();
    InProcessGroup::P2POp& send = is_send_ ? op_ : *other;
    InProcessGroup::P2POp& recv = is_send_ ? *other : op_;
    TESSERA_CHECK(send.bytes == recv.bytes, text_.what + " " + text_.where + ": the send has " +
                                                std::to_string(send.bytes) + " bytes, the recv " +
                                                std::to_string(recv.bytes));
    if (send.bytes) std::memcpy(recv.data, send.data, send.bytes);
    send.done = recv.done = true;
    g_->cv.notify_all();
  }

  void wait() override {
    if (waited_) return;
    waited_ = true;
    std::unique_lock<std::mutex> lock(g_->mu);
    g_->cv.wait_until(lock, Clock::now() + g_->timeout, [&] { return op_.done || g_->broken; });
    if (op_.done) return;
    auto& box = g_->mailboxes[pair_];
    auto& mine = is_send_ ? box.sends : box.recvs;
    if (auto it = std::find(mine.begin(), mine.end(), &op_); it != mine.end()) mine.erase(it);
    if (g_->broken) g_->throw_broken();
    throw runtime_error(text_.what + " " + text_.where + " timed out after " + std::to_string(g_->timeout.count()) +
                            " ms: " + text_.absent,
                        kP2PTimeoutHint);
  }

 private:
  std::shared_ptr<InProcessGroup> g_;
  std::pair<int, int> pair_;  // (src, dst)
  bool is_send_;
  InProcessGroup::P2POp op_;
  P2PText text_;
  bool waited_ = true;  // until posted
};

class InProcessCommunicator final : public Communicator {
 public:
  InProcessCommunicator(std::shared_ptr<InProcessGroup> group, int rank) : g_(std::move(group)), rank_(rank) {}

  int rank() const override { return rank_; }
  int size() const override { return g_->size; }
  std::string backend_name() const override { return "in-process"; }
  std::string group_name() const override { return g_->name; }
  std::vector<int> world_ranks() const override { return g_->world_ranks; }

  void all_reduce(Tensor t, ReduceOp op) override {
    queue_.drain();
    all_reduce_now(t, op);
  }

  std::unique_ptr<Work> all_reduce_async(Tensor t, ReduceOp op) override {
    check_host(t, "all_reduce_async");
    check_reducible(t, "all_reduce_async");
    return queue_.submit(call_text(std::string("all_reduce(") + reduce_op_name(op) + ")", t),
                         [this, t, op] { all_reduce_now(t, op); });
  }

  void all_gather(Tensor out, Tensor in) override {
    queue_.drain();
    check_host(out, "all_gather");
    check_host(in, "all_gather");
    check_same_dtype(out, in, "all_gather");
    TESSERA_CHECK(out.numel() == in.numel() * size(), "all_gather: out has " + std::to_string(out.numel()) +
                                                          " elements, expected size x in = " +
                                                          std::to_string(in.numel() * size()));
    const size_t bytes = in.bytes();
    collective(call_text("all_gather", in), cpu_memory(in), cpu_memory(out), [&](std::vector<uint8_t>& result) {
      result.resize(bytes * size());
      for (int r = 0; r < size(); ++r) std::memcpy(result.data() + r * bytes, g_->in[r], bytes);
    });
  }

  void reduce_scatter(Tensor out, Tensor in, ReduceOp op) override {
    queue_.drain();
    check_host(out, "reduce_scatter");
    check_host(in, "reduce_scatter");
    check_same_dtype(out, in, "reduce_scatter");
    check_reducible(in, "reduce_scatter");
    TESSERA_CHECK(in.numel() == out.numel() * size(), "reduce_scatter: in has " + std::to_string(in.numel()) +
                                                          " elements, expected size x out = " +
                                                          std::to_string(out.numel() * size()));
    const size_t bytes = out.bytes();
    const size_t n = static_cast<size_t>(out.numel());
    collective(call_text(std::string("reduce_scatter(") + reduce_op_name(op) + ")", in), cpu_memory(in), cpu_memory(out),
               [&](std::vector<uint8_t>& result) {
                 result.resize(bytes);
                 const size_t offset = static_cast<size_t>(rank_) * bytes;
                 std::memcpy(result.data(), static_cast<const uint8_t*>(g_->in[0]) + offset, bytes);
                 for (int r = 1; r < size(); ++r)
                   reduce_into(in.dtype, op, result.data(), static_cast<const uint8_t*>(g_->in[r]) + offset, n);
               });
  }

  void broadcast(Tensor t, int root) override {
    queue_.drain();
    check_host(t, "broadcast");
    TESSERA_CHECK(root >= 0 && root < size(), "broadcast: root " + std::to_string(root) + " is not a rank of " +
                                                  g_->where());
    const size_t bytes = t.bytes();
    collective(call_text("broadcast(root " + std::to_string(root) + ")", t), cpu_memory(t), cpu_memory(t),
               [&](std::vector<uint8_t>& result) {
                 const auto* src = static_cast<const uint8_t*>(g_->in[root]);
                 result.assign(src, src + bytes);
               });
  }

  void send(Tensor t, int dst) override {
    queue_.drain();
    post_p2p(t, dst, /*is_send=*/true, "send")->wait();
  }

  void recv(Tensor t, int src) override {
    queue_.drain();
    post_p2p(t, src, /*is_send=*/false, "recv")->wait();
  }

  std::unique_ptr<Work> send_async(Tensor t, int dst) override { return post_p2p(t, dst, true, "send_async"); }
  std::unique_ptr<Work> recv_async(Tensor t, int src) override { return post_p2p(t, src, false, "recv_async"); }

  void barrier() override {
    queue_.drain();
    std::unique_lock<std::mutex> lock(g_->mu);
    g_->barrier(rank_, "barrier", lock);
  }

  std::unique_ptr<Communicator> split(const std::vector<std::vector<int>>& groups, const std::string& name) override {
    queue_.drain();
    const int mine = find_split_group(groups, size(), rank_);
    const int seq = splits_++;
    std::shared_ptr<InProcessGroup> sub;
    int sub_rank = -1;
    {
      std::unique_lock<std::mutex> lock(g_->mu);
      auto& st = g_->splits[seq];
      if (st.subgroups.empty()) {
        st.groups = groups;
        for (size_t i = 0; i < groups.size(); ++i) {
          std::vector<int> world;
          for (int r : groups[i]) world.push_back(g_->world_ranks[r]);
          std::string sub_name = name.empty() ? g_->name + "/split" + std::to_string(seq) : name;
          st.subgroups.push_back(std::make_shared<InProcessGroup>(sub_name, std::move(world), g_->timeout));
        }
      } else if (st.groups != groups) {
        throw runtime_error("split on " + g_->where() + ": the ranks passed different lists of groups",
                            "every rank must call split with the same lists");
      }
      if (mine >= 0) {
        sub = st.subgroups[mine];
        for (size_t i = 0; i < groups[mine].size(); ++i)
          if (groups[mine][i] == rank_) sub_rank = static_cast<int>(i);
      }
      if (++st.fetched == size()) g_->splits.erase(seq);
      g_->barrier(rank_, "split", lock);
    }
    if (!sub) return nullptr;
    return std::make_unique<InProcessCommunicator>(std::move(sub), sub_rank);
  }

 private:
  void all_reduce_now(Tensor t, ReduceOp op) {
    check_host(t, "all_reduce");
    check_reducible(t, "all_reduce");
    const size_t bytes = t.bytes();
    const size_t n = static_cast<size_t>(t.numel());
    collective(call_text(std::string("all_reduce(") + reduce_op_name(op) + ")", t), cpu_memory(t), cpu_memory(t),
               [&](std::vector<uint8_t>& result) {
                 const auto* first = static_cast<const uint8_t*>(g_->in[0]);
                 result.assign(first, first + bytes);
                 for (int r = 1; r < size(); ++r) reduce_into(t.dtype, op, result.data(), g_->in[r], n);
               });
  }

  // Publishes in/out, waits for everyone, computes this rank's result from all inputs into
  // a private buffer, waits again (so nobody reads an input that is being overwritten), then
  // writes the result to out.
  std::unique_ptr<Work> post_p2p(const Tensor& t, int peer, bool is_send, const char* op) {
    check_host(t, op);
    TESSERA_CHECK(peer >= 0 && peer < size() && peer != rank_,
                  std::string(op) + ": bad " + (is_send ? "destination" : "source") + " rank " +
                      std::to_string(peer) + " in " + g_->where());
    if (sent_to_.empty()) sent_to_.assign(size(), 0), received_from_.assign(size(), 0);
    const uint64_t k = is_send ? sent_to_[peer]++ : received_from_[peer]++;
    auto work = std::make_unique<InProcessP2PWork>(
        g_, is_send ? std::pair(rank_, peer) : std::pair(peer, rank_), is_send, t,
        p2p_text(op, t, is_send, k, g_->name, g_->world_ranks, rank_, peer));
    work->post();
    return work;
  }

  template <typename Compute>
  void collective(const std::string& call, const void* in, void* out, Compute compute) {
    std::vector<uint8_t> result;
    {
      std::unique_lock<std::mutex> lock(g_->mu);
      if (g_->broken) g_->throw_broken();
      g_->in[rank_] = in;
      g_->out[rank_] = out;
      g_->barrier(rank_, call, lock);
      compute(result);
      g_->barrier(rank_, call + " (end)", lock);
    }
    if (!result.empty()) std::memcpy(out, result.data(), result.size());
  }

  std::shared_ptr<InProcessGroup> g_;
  int rank_;
  int splits_ = 0;
  std::vector<uint64_t> sent_to_, received_from_;  // p2p messages posted, per peer (for errors)
  AsyncQueue queue_;  // last: destroyed first, while the group is alive
};

}  // namespace

InProcessWorld::InProcessWorld(int size, milliseconds timeout) {
  TESSERA_CHECK(size >= 1, "InProcessWorld: size must be at least 1");
  std::vector<int> ranks(size);
  for (int r = 0; r < size; ++r) ranks[r] = r;
  group_ = std::make_shared<InProcessGroup>("world", std::move(ranks), timeout);
}

InProcessWorld::~InProcessWorld() = default;

int InProcessWorld::size() const { return group_->size; }

std::unique_ptr<Communicator> InProcessWorld::communicator(int rank) {
  TESSERA_CHECK(rank >= 0 && rank < group_->size, "InProcessWorld: rank out of range");
  return std::make_unique<InProcessCommunicator>(group_, rank);
}

void run_in_process_ranks(int size, const std::function<void(Communicator&)>& body, milliseconds timeout) {
  InProcessWorld world(size, timeout);
  std::vector<std::exception_ptr> errors(size);
  std::vector<std::thread> threads;
  for (int r = 0; r < size; ++r)
    threads.emplace_back([&, r] {
      try {
        auto comm = world.communicator(r);
        body(*comm);
      } catch (...) {
        errors[r] = std::current_exception();
      }
    });
  for (auto& t : threads) t.join();
  for (auto& e : errors)
    if (e) std::rethrow_exception(e);
}

}  // namespace tessera
