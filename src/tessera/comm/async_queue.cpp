#include "tessera/comm/async_queue.h"

#include "tessera/core/error.h"

namespace tessera::comm_detail {

struct AsyncQueue::State {
  std::mutex mu;
  std::condition_variable cv;
  bool done = false;
  std::exception_ptr error;
};

namespace {
class QueuedWork final : public Work {
 public:
  explicit QueuedWork(std::function<void()> wait) : wait_(std::move(wait)) {}
  void wait() override { wait_(); }

 private:
  std::function<void()> wait_;
};
}  // namespace

std::unique_ptr<Work> AsyncQueue::submit(std::string what, std::function<void()> op) {
  auto state = std::make_shared<State>();
  {
    std::lock_guard<std::mutex> lock(mu_);
    if (!thread_.joinable()) thread_ = std::thread([this] { run(); });
    queue_.push_back(Item{std::move(what), std::move(op), state});
  }
  cv_.notify_all();
  return std::make_unique<QueuedWork>([state] {
    std::unique_lock<std::mutex> lock(state->mu);
    state->cv.wait(lock, [&] { return state->done; });
    if (state->error) std::rethrow_exception(state->error);
  });
}

void AsyncQueue::drain() {
  std::unique_lock<std::mutex> lock(mu_);
  cv_.wait(lock, [&] { return queue_.empty() && !busy_; });
}

void AsyncQueue::run() {
  while (true) {
    Item item;
    {
      std::unique_lock<std::mutex> lock(mu_);
      cv_.wait(lock, [&] { return stopping_ || !queue_.empty(); });
      if (queue_.empty()) return;  // stopping with nothing left
      item = std::move(queue_.front());
      queue_.pop_front();
      busy_ = true;
    }
    std::exception_ptr error;
    std::string failed;
    {
      std::lock_guard<std::mutex> lock(mu_);
      failed = failed_;
    }
    if (!failed.empty()) {
      error = std::make_exception_ptr(
          runtime_error(item.what + " was not run: an earlier asynchronous operation on this group failed (" +
                        failed + ")"));
    } else {
      try {
        item.op();
      } catch (const std::exception& e) {
        error = std::current_exception();
        std::lock_guard<std::mutex> lock(mu_);
        failed_ = item.what + ": " + e.what();
      } catch (...) {
        error = std::current_exception();
        std::lock_guard<std::mutex> lock(mu_);
        failed_ = item.what + ": unknown error";
      }
    }
    {
      std::lock_guard<std::mutex> lock(item.state->mu);
      item.state->done = true;
      item.state->error = error;
    }
    item.state->cv.notify_all();
    {
      std::lock_guard<std::mutex> lock(mu_);
      busy_ = false;
    }
    cv_.notify_all();
  }
}

AsyncQueue::~AsyncQueue() {
  {
    std::lock_guard<std::mutex> lock(mu_);
    stopping_ = true;
  }
  cv_.notify_all();
  if (thread_.joinable()) thread_.join();
}

}  // namespace tessera::comm_detail
