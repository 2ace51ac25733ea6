#include "core/host_lane.h"

#include <pthread.h>

#include <system_error>

#include "common/resource_counts.h"

namespace gflow {

bool overlaps(const Footprint& a, const Footprint& b) {
  for (const MemoryRange& x : a) {
    const auto* xs = static_cast<const char*>(x.at);
    for (const MemoryRange& y : b) {
      const auto* ys = static_cast<const char*>(y.at);
      if (x.bytes > 0 && y.bytes > 0 && xs < ys + y.bytes && ys < xs + x.bytes) return true;
    }
  }
  return false;
}

bool OnceStep::claim() {
  std::lock_guard<std::mutex> lock(mutex_);
  if (state_ != State::kIdle) return false;
  state_ = State::kRunning;
  return true;
}

void OnceStep::execute() noexcept {
  std::exception_ptr error;
  try {
    fn_();
  } catch (...) {
    error = std::current_exception();
  }
  {
    std::lock_guard<std::mutex> lock(mutex_);
    error_ = error;
    state_ = State::kDone;
  }
  cv_.notify_all();
}

void OnceStep::run() {
  if (claim()) execute();
  std::unique_lock<std::mutex> lock(mutex_);
  cv_.wait(lock, [&] { return state_ == State::kDone; });
  if (error_) std::rethrow_exception(error_);
}

void OnceStep::runQuietly() noexcept {
  if (claim()) execute();
}

void OnceStep::settle() noexcept {
  std::unique_lock<std::mutex> lock(mutex_);
  if (state_ == State::kIdle) state_ = State::kDone;
  cv_.wait(lock, [&] { return state_ == State::kDone; });
}

HostLane::~HostLane() {
  {
    std::lock_guard<std::mutex> lock(mutex_);
    stop_ = true;
  }
  cv_.notify_all();
  if (thread_.joinable()) thread_.join();
}

void HostLane::post(Footprint touches, std::function<void()> job) {
  {
    std::lock_guard<std::mutex> lock(mutex_);
    if (!thread_.joinable()) {
      try {
        thread_ = std::thread([this, setup = setup_] {
          pthread_setname_np(pthread_self(), "gflow-host");
          if (setup) setup();
          loop();
        });
        resources::threadStarted();
      } catch (const std::system_error&) {
        // No thread to be had (EAGAIN): the job runs here, in order, as
        // before the lane existed; nothing was queued for a thread to run.
      }
    }
    if (thread_.joinable()) {
      queue_.push_back(Job{++posted_, std::move(touches), std::move(job)});
      job = nullptr;
    }
  }
  if (job) {
    job();
    return;
  }
  cv_.notify_all();
}

void HostLane::setThreadSetup(std::function<void()> setup) {
  std::lock_guard<std::mutex> lock(mutex_);
  setup_ = std::move(setup);
}

void HostLane::waitUntil(std::unique_lock<std::mutex>& lock, uint64_t seq) {
  cv_.wait(lock, [&] { return ended_ >= seq; });
}

void HostLane::waitFor(const Footprint& f) {
  std::unique_lock<std::mutex> lock(mutex_);
  uint64_t last = 0;  // jobs end in order: waiting for the last overlapping one suffices
  for (const Job& j : queue_) {
    if (overlaps(j.touches, f)) last = j.seq;
  }
  waitUntil(lock, last);
}

void HostLane::drain() {
  std::unique_lock<std::mutex> lock(mutex_);
  waitUntil(lock, posted_);
}

void HostLane::loop() {
  std::unique_lock<std::mutex> lock(mutex_);
  for (;;) {
    cv_.wait(lock, [&] { return stop_ || !queue_.empty(); });
    if (queue_.empty()) return;  // stopping, and everything ran
    std::function<void()> fn = std::move(queue_.front().fn);
    const uint64_t seq = queue_.front().seq;
    lock.unlock();
    fn();          // must not throw
    fn = nullptr;  // what it holds goes before the job counts as ended
    lock.lock();
    queue_.pop_front();
    ended_ = seq;
    cv_.notify_all();
  }
}

}  // namespace gflow
