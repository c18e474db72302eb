#include "envs/core/thread_pool.h"

#include <pthread.h>
#include <torch/headeronly/util/Exception.h>

#include <exception>

namespace nostall::envs {

ThreadPool::ThreadPool(int64_t num_workers) {
  try {
    workers_.reserve(static_cast<size_t>(num_workers));
    for (int64_t i = 0; i < num_workers; ++i) {
      workers_.emplace_back([this] { work(); });
      // Named, so a profiler, a debugger or a test can tell them from other threads; by the
      // creator, so the name is there when the constructor returns (a thread naming itself
      // may not have run yet).
      pthread_setname_np(workers_.back().native_handle(), "nostall-env");
    }
  } catch (const std::exception& e) {
    // The destructor will not run: join the threads already started, or their std::thread
    // objects would terminate the process. Then report the cause.
    join_all();
    STD_TORCH_CHECK(false, "could not start ", num_workers, " environment threads (",
                    workers_.size(), " started): ", e.what());
  }
}

void ThreadPool::join_all() {
  {
    std::lock_guard<std::mutex> lock(mutex_);
    stopping_ = true;
  }
  has_task_.notify_all();
  for (std::thread& t : workers_) t.join();
  workers_.clear();
}

ThreadPool::~ThreadPool() { join_all(); }

void ThreadPool::submit(std::function<void()> task) {
  {
    std::lock_guard<std::mutex> lock(mutex_);
    tasks_.push_back(std::move(task));
  }
  has_task_.notify_one();
}

void ThreadPool::work() {
  for (;;) {
    std::function<void()> task;
    {
      std::unique_lock<std::mutex> lock(mutex_);
      has_task_.wait(lock, [this] { return stopping_ || !tasks_.empty(); });
      if (tasks_.empty()) return;  // stopping, and every queued task has run
      task = std::move(tasks_.front());
      tasks_.pop_front();
    }
    task();
  }
}

void ThreadPool::parallel_for(int64_t n, int64_t parts,
                              const std::function<void(int64_t, int64_t)>& fn) {
  if (parts <= 1 || workers_.empty()) {
    fn(0, n);
    return;
  }
  std::mutex done_mutex;
  std::condition_variable all_done;
  int64_t remaining = parts - 1;
  std::exception_ptr error;
  const int64_t share = (n + parts - 1) / parts;
  for (int64_t p = 1; p < parts; ++p) {
    const int64_t begin = p * share;
    const int64_t end = begin + share < n ? begin + share : n;
    submit([&, begin, end] {
      try {
        if (begin < end) fn(begin, end);
      } catch (...) {
        std::lock_guard<std::mutex> lock(done_mutex);
        error = std::current_exception();
      }
      std::lock_guard<std::mutex> lock(done_mutex);
      if (--remaining == 0) all_done.notify_one();
    });
  }
  std::exception_ptr own_error;
  try {
    fn(0, share < n ? share : n);
  } catch (...) {
    own_error = std::current_exception();
  }
  std::unique_lock<std::mutex> lock(done_mutex);
  all_done.wait(lock, [&] { return remaining == 0; });
  if (own_error) std::rethrow_exception(own_error);
  if (error) std::rethrow_exception(error);
}

}  // namespace nostall::envs
