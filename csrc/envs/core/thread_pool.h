// A fixed pool of worker threads with two uses: a blocking parallel-for over environment
// ranges (the caller runs one share itself) and fire-and-forget tasks for asynchronous
// stepping. Workers are joined in the destructor, after the queued tasks have run.
#pragma once

#include <condition_variable>
#include <cstdint>
#include <deque>
#include <functional>
#include <mutex>
#include <thread>
#include <vector>

namespace nostall::envs {

class ThreadPool {
 public:
  explicit ThreadPool(int64_t num_workers);
  ~ThreadPool();
  ThreadPool(const ThreadPool&) = delete;
  ThreadPool& operator=(const ThreadPool&) = delete;

  int64_t num_workers() const { return static_cast<int64_t>(workers_.size()); }

  // Runs fn(begin, end) over `parts` contiguous shares of [0, n) and returns when all are done.
  void parallel_for(int64_t n, int64_t parts, const std::function<void(int64_t, int64_t)>& fn);

  void submit(std::function<void()> task);

 private:
  void work();
  void join_all();

  std::mutex mutex_;
  std::condition_variable has_task_;
  std::deque<std::function<void()>> tasks_;
  bool stopping_ = false;
  std::vector<std::thread> workers_;
};

}  // namespace nostall::envs
