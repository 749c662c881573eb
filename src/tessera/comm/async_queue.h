// Runs a communicator's asynchronous operations in call order on one background thread
// (internal to comm/ backends). Synchronous operations call drain() first, so every rank
// executes the group's operations in the order it issued them.
#pragma once

#include <condition_variable>
#include <deque>
#include <exception>
#include <functional>
#include <memory>
#include <mutex>
#include <string>
#include <thread>

#include "tessera/comm/communicator.h"

namespace tessera::comm_detail {

class AsyncQueue {
 public:
  AsyncQueue() = default;
  ~AsyncQueue();  // runs what is queued, then joins the thread
  AsyncQueue(const AsyncQueue&) = delete;
  AsyncQueue& operator=(const AsyncQueue&) = delete;

  // Queues `op`; its exception, if any, is rethrown by Work::wait(). After an op fails, the
  // ops queued behind it fail at once with an error naming `what` of the failed one.
  std::unique_ptr<Work> submit(std::string what, std::function<void()> op);
  // Waits until every submitted op has finished.
  void drain();

 private:
  struct State;
  struct Item {
    std::string what;
    std::function<void()> op;
    std::shared_ptr<State> state;
  };
  void run();

  std::mutex mu_;
  std::condition_variable cv_;
  std::deque<Item> queue_;
  bool busy_ = false;
  bool stopping_ = false;
  std::string failed_;  // what of the first failed op, with its message
  std::thread thread_;
};

}  // namespace tessera::comm_detail
