#include "tessera/comm/in_process/in_process_communicator.h"

#include <algorithm>
#include <condition_variable>
#include <cstring>
#include <deque>
#include <exception>
#include <map>
#include <mutex>
#include <thread>

#include "tessera/comm/group_communicator.h"
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
    throw collective_timeout(call + " on " + where(), timeout,
                             ": world rank(s) " + ranks_text(missing) + " had not called it");
  }
};

}  // namespace comm_detail

namespace {

// One posted send or recv; its op sits in the pair's mailbox until the other side matches it.
class InProcessP2PWork final : public Work {
 public:
  InProcessP2PWork(std::shared_ptr<InProcessGroup> g, std::pair<int, int> pair, bool is_send, void* data,
                   size_t bytes, P2PText text)
      : g_(std::move(g)), pair_(pair), is_send_(is_send), op_{data, bytes}, text_(std::move(text)) {}

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
    throw p2p_timeout(text_, g_->timeout);
  }

 private:
  std::shared_ptr<InProcessGroup> g_;
  std::pair<int, int> pair_;  // (src, dst)
  bool is_send_;
  InProcessGroup::P2POp op_;
  P2PText text_;
  bool waited_ = true;  // until posted
};

class InProcessTransport final : public Transport {
 public:
  InProcessTransport(std::shared_ptr<InProcessGroup> g, int rank)
      : Transport(Group{"in-process", g->name, g->world_ranks, rank, g->timeout}), g_(std::move(g)) {}

  void all_reduce(void* data, size_t count, DType dtype, ReduceOp op, const Call& c) override {
    const size_t bytes = count * dtype_size(dtype);
    collective(c.what, data, data, [&](std::vector<uint8_t>& result) {
      const auto* first = static_cast<const uint8_t*>(g_->in[0]);
      result.assign(first, first + bytes);
      for (int r = 1; r < g_->size; ++r) reduce_into(dtype, op, result.data(), g_->in[r], count);
    });
  }

  void all_gather(void* out, const void* in, size_t bytes, const Call& c) override {
    collective(c.what, in, out, [&](std::vector<uint8_t>& result) {
      result.resize(bytes * g_->size);
      for (int r = 0; r < g_->size; ++r) std::memcpy(result.data() + r * bytes, g_->in[r], bytes);
    });
  }

  void reduce_scatter(void* out, const void* in, size_t count, DType dtype, ReduceOp op, const Call& c) override {
    const size_t bytes = count * dtype_size(dtype);
    const size_t offset = static_cast<size_t>(rank()) * bytes;
    collective(c.what, in, out, [&](std::vector<uint8_t>& result) {
      result.resize(bytes);
      std::memcpy(result.data(), static_cast<const uint8_t*>(g_->in[0]) + offset, bytes);
      for (int r = 1; r < g_->size; ++r)
        reduce_into(dtype, op, result.data(), static_cast<const uint8_t*>(g_->in[r]) + offset, count);
    });
  }

  void broadcast(void* data, size_t bytes, int root, const Call& c) override {
    collective(c.what, data, data, [&](std::vector<uint8_t>& result) {
      const auto* src = static_cast<const uint8_t*>(g_->in[root]);
      result.assign(src, src + bytes);
    });
  }

  void barrier(const Call& c) override {
    std::unique_lock<std::mutex> lock(g_->mu);
    g_->barrier(rank(), c.what, lock);
  }

  std::unique_ptr<Work> post(void* data, size_t bytes, int peer, bool is_send, uint64_t, const P2PText& text) override {
    auto work = std::make_unique<InProcessP2PWork>(
        g_, is_send ? std::pair(rank(), peer) : std::pair(peer, rank()), is_send, data, bytes, text);
    work->post();
    return work;
  }

  // The first rank to get here builds every subgroup of split `plan.seq`; the others check
  // they were given the same lists and take theirs.
  std::unique_ptr<Transport> split(const SplitPlan& plan) override {
    std::shared_ptr<InProcessGroup> sub;
    int sub_rank = -1;
    {
      std::unique_lock<std::mutex> lock(g_->mu);
      auto& st = g_->splits[plan.seq];
      if (st.subgroups.empty()) {
        st.groups = plan.groups;
        for (size_t i = 0; i < plan.groups.size(); ++i) {
          Group s = plan.subgroup(group(), static_cast<int>(i), rank());
          st.subgroups.push_back(std::make_shared<InProcessGroup>(s.name, std::move(s.world_ranks), g_->timeout));
        }
      } else if (st.groups != plan.groups) {
        throw runtime_error("split on " + g_->where() + ": the ranks passed different lists of groups",
                            "every rank must call split with the same lists");
      }
      if (plan.mine >= 0) {
        sub = st.subgroups[plan.mine];
        sub_rank = plan.subgroup(group(), plan.mine, rank()).rank;
      }
      if (++st.fetched == g_->size) g_->splits.erase(plan.seq);
      g_->barrier(rank(), "split", lock);
    }
    if (!sub) return nullptr;
    return std::make_unique<InProcessTransport>(std::move(sub), sub_rank);
  }

 private:
  int rank() const { return group().rank; }

  // Publishes in/out, waits for everyone, computes this rank's result from all inputs into
  // a private buffer, waits again (so nobody reads an input that is being overwritten), then
  // writes the result to out.
  template <typename Compute>
  void collective(const std::string& call, const void* in, void* out, Compute compute) {
    std::vector<uint8_t> result;
    {
      std::unique_lock<std::mutex> lock(g_->mu);
      if (g_->broken) g_->throw_broken();
      g_->in[rank()] = in;
      g_->out[rank()] = out;
      g_->barrier(rank(), call, lock);
      compute(result);
      g_->barrier(rank(), call + " (end)", lock);
    }
    if (!result.empty()) std::memcpy(out, result.data(), result.size());
  }

  std::shared_ptr<InProcessGroup> g_;
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
  return std::make_unique<GroupCommunicator>(transport(rank));
}

std::unique_ptr<comm_detail::Transport> InProcessWorld::transport(int rank) {
  TESSERA_CHECK(rank >= 0 && rank < group_->size, "InProcessWorld: rank out of range");
  return std::make_unique<InProcessTransport>(group_, rank);
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
