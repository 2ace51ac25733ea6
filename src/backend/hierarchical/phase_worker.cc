#include "backend/hierarchical/phase_worker.h"

#include <pthread.h>

#include <utility>

#include "common/check.h"
#include "common/resource_counts.h"

namespace gflow::backend {

PhaseWorker::~PhaseWorker() {
  if (!thread_.joinable()) return;
  {
    const std::lock_guard<std::mutex> lock(mutex_);
    stop_ = true;
  }
  changed_.notify_all();
  thread_.join();
}

void PhaseWorker::start(std::function<void()> phase) {
  GFLOW_ENFORCE(!pending_);
  // The thread first: if it cannot start, the error reaches the caller
  // with nothing pending, so no wait() blocks on a phase nobody runs.
  if (!thread_.joinable()) {
    resources::threadStarted();
    thread_ = std::thread([this] {
      pthread_setname_np(pthread_self(), "gflow-phase");
      loop();
    });
  }
  {
    const std::lock_guard<std::mutex> lock(mutex_);
    phase_ = std::move(phase);
    done_ = false;
    error_ = nullptr;
  }
  pending_ = true;
  changed_.notify_all();
}

void PhaseWorker::wait() {
  if (!pending_) return;
  std::unique_lock<std::mutex> lock(mutex_);
  changed_.wait(lock, [this] { return done_; });
  pending_ = false;
  if (error_) std::rethrow_exception(std::exchange(error_, nullptr));
}

void PhaseWorker::loop() {
  std::unique_lock<std::mutex> lock(mutex_);
  for (;;) {
    changed_.wait(lock, [this] { return stop_ || phase_; });
    if (!phase_) return;  // stopped with nothing to run
    std::function<void()> phase = std::exchange(phase_, nullptr);
    lock.unlock();
    std::exception_ptr error;
    try {
      phase();
    } catch (...) {
      error = std::current_exception();
    }
    lock.lock();
    error_ = error;
    done_ = true;
    changed_.notify_all();
  }
}

}  // namespace gflow::backend
