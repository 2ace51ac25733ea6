// StickyError: the first error that failed an object, kept for good.
//
// Several threads may fail the object at once (the owning thread on a peer
// failure, another thread through abort()); the first error wins and every
// later caller sees that one. failed() is one atomic load, cheap enough for
// every call on a latency path. An optional wake callback (set once, before
// other threads can reach the object) lets setAndWake() rouse a thread that
// sleeps waiting for progress.
//
// Thread safety: every method may be called from any thread.
#pragma once

#include <atomic>
#include <functional>
#include <memory>
#include <mutex>
#include <utility>

#include "gflow/error.h"

namespace gflow {

class StickyError {
 public:
  StickyError() = default;
  explicit StickyError(std::function<void()> wake) : wake_(std::move(wake)) {}
  StickyError(const StickyError&) = delete;
  StickyError& operator=(const StickyError&) = delete;

  // Records `e` unless an error is already held; returns the error that
  // holds (the first one). *recorded (if given) says whether this call
  // recorded `e`, i.e. was the first: exactly one call ever sees true.
  std::shared_ptr<const Error> set(const Error& e, bool* recorded = nullptr) {
    std::shared_ptr<const Error> first;
    {
      std::lock_guard<std::mutex> lock(mutex_);
      const bool isFirst = !error_;
      if (isFirst) error_ = std::make_shared<const Error>(e);
      if (recorded) *recorded = isFirst;
      first = error_;
    }
    failed_.store(true, std::memory_order_release);
    return first;
  }

  // set(), then runs the wake callback (if any), so that a waiter on another
  // thread notices at once.
  std::shared_ptr<const Error> setAndWake(const Error& e) {
    std::shared_ptr<const Error> first = set(e);
    if (wake_) wake_();
    return first;
  }

  // Whether an error is held; once true, get() returns it (never null).
  bool failed() const { return failed_.load(std::memory_order_acquire); }

  // The first error, or null while none is held.
  std::shared_ptr<const Error> get() const {
    std::lock_guard<std::mutex> lock(mutex_);
    return error_;
  }

  // Throws the first error, if any.
  void throwIfFailed() const {
    if (failed()) throw *get();
  }

 private:
  std::function<void()> wake_;
  std::atomic<bool> failed_{false};
  mutable std::mutex mutex_;
  std::shared_ptr<const Error> error_;
};

}  // namespace gflow
