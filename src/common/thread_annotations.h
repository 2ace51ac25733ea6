// What each thread may touch, stated in the code and checked by clang's
// thread-safety analysis (-Wthread-safety, on in every clang build of gflow;
// other compilers see no attributes).
//
//   - A field that a lock guards is GFLOW_GUARDED_BY(thatMutex); a function
//     that expects the lock held is GFLOW_REQUIRES(thatMutex), one that
//     takes it itself GFLOW_EXCLUDES(thatMutex). Locks are gflow::Mutex and
//     gflow::MutexLock (std::mutex and std::unique_lock, which libstdc++
//     does not annotate).
//   - A field that only one thread touches (a communicator's executing
//     thread, a context's owning thread, the store server's loop) is
//     GFLOW_GUARDED_BY(aThreadRole): a ThreadRole is a capability no lock
//     backs; the functions that run on that thread are GFLOW_REQUIRES(role)
//     or, where a call enters the role (a thread's main loop, an entry point
//     documented to run on that thread), call role.enter() first. A
//     function that runs on any thread (abort(), counters) holds no role, so
//     the analysis rejects its touching such a field.
//
// See https://clang.llvm.org/docs/ThreadSafetyAnalysis.html.
#pragma once

#include <chrono>
#include <condition_variable>
#include <mutex>

#if defined(__clang__)
#define GFLOW_THREAD_ANNOTATION(x) __attribute__((x))
#else
#define GFLOW_THREAD_ANNOTATION(x)
#endif

#define GFLOW_CAPABILITY(name) GFLOW_THREAD_ANNOTATION(capability(name))
#define GFLOW_SCOPED_CAPABILITY GFLOW_THREAD_ANNOTATION(scoped_lockable)
#define GFLOW_GUARDED_BY(x) GFLOW_THREAD_ANNOTATION(guarded_by(x))
#define GFLOW_PT_GUARDED_BY(x) GFLOW_THREAD_ANNOTATION(pt_guarded_by(x))
#define GFLOW_REQUIRES(...) GFLOW_THREAD_ANNOTATION(requires_capability(__VA_ARGS__))
#define GFLOW_EXCLUDES(...) GFLOW_THREAD_ANNOTATION(locks_excluded(__VA_ARGS__))
#define GFLOW_ACQUIRE(...) GFLOW_THREAD_ANNOTATION(acquire_capability(__VA_ARGS__))
#define GFLOW_RELEASE(...) GFLOW_THREAD_ANNOTATION(release_capability(__VA_ARGS__))
#define GFLOW_TRY_ACQUIRE(...) GFLOW_THREAD_ANNOTATION(try_acquire_capability(__VA_ARGS__))
#define GFLOW_ASSERT_CAPABILITY(x) GFLOW_THREAD_ANNOTATION(assert_capability(x))
#define GFLOW_NO_THREAD_SAFETY_ANALYSIS GFLOW_THREAD_ANNOTATION(no_thread_safety_analysis)

namespace gflow {

class MutexLock;

// std::mutex with the analysis' attributes.
class GFLOW_CAPABILITY("mutex") Mutex {
 public:
  void lock() GFLOW_ACQUIRE() { m_.lock(); }
  void unlock() GFLOW_RELEASE() { m_.unlock(); }

 private:
  friend class MutexLock;
  std::mutex m_;
};

// A std::unique_lock on a Mutex: held from construction to destruction
// (or unlock()), and the lock that condition variables wait with.
class GFLOW_SCOPED_CAPABILITY MutexLock {
 public:
  explicit MutexLock(Mutex& m) GFLOW_ACQUIRE(m) : lock_(m.m_) {}
  ~MutexLock() GFLOW_RELEASE() {}
  MutexLock(const MutexLock&) = delete;
  MutexLock& operator=(const MutexLock&) = delete;

  void unlock() GFLOW_RELEASE() { lock_.unlock(); }
  void lock() GFLOW_ACQUIRE() { lock_.lock(); }
  // Releases the lock while it waits for `cv` (or `until`), and holds it
  // again when it returns, as std::condition_variable does.
  void wait(std::condition_variable& cv) { cv.wait(lock_); }
  template <class Clock, class Duration>
  std::cv_status waitUntil(std::condition_variable& cv,
                           const std::chrono::time_point<Clock, Duration>& until) {
    return cv.wait_until(lock_, until);
  }

 private:
  std::unique_lock<std::mutex> lock_;
};

// The capability of playing one thread's role: no lock, no run-time cost.
class GFLOW_CAPABILITY("thread role") ThreadRole {
 public:
  // The calling thread plays the role from here to the end of the calling
  // function, as its documentation says it does.
  void enter() const GFLOW_ASSERT_CAPABILITY(this) {}
};

}  // namespace gflow
