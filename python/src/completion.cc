// Asynchronous completion for Python: the Completer thread (waits for work
// without the GIL, then runs Python callbacks with it) and PyWork, the
// state behind gflow.Work.
#include <condition_variable>
#include <deque>
#include <mutex>
#include <thread>

#include "bindings.h"

namespace gflow {
namespace python {

struct Completer::State {
  std::mutex mu;
  std::condition_variable cv;
  std::deque<Job> jobs;
  bool started = false;
  bool stopping = false;
  bool inCallback = false;
  std::thread thread;
};

Completer::Completer() : state_(std::make_shared<State>()) {}

Completer& Completer::instance() {
  // Leaked on purpose: it must outlive interpreter finalization.
  static Completer* c = new Completer();
  return *c;
}

void Completer::enqueue(std::function<void()> wait, std::function<void()> done) {
  std::lock_guard<std::mutex> lock(state_->mu);
  if (state_->stopping) {
    // Interpreter exit: nothing will run; keep the Python objects alive.
    new Job{std::move(wait), std::move(done)};
    return;
  }
  state_->jobs.push_back(Job{std::move(wait), std::move(done)});
  if (!state_->started) {
    state_->started = true;
    state_->thread = std::thread([this] { run(); });
  }
  state_->cv.notify_all();
}

void Completer::run() {
  std::shared_ptr<State> s = state_;
  for (;;) {
    Job job;
    {
      std::unique_lock<std::mutex> lock(s->mu);
      s->cv.wait(lock, [&] { return s->stopping || !s->jobs.empty(); });
      if (s->stopping) return;
      job = std::move(s->jobs.front());
      s->jobs.pop_front();
    }
    job.wait();  // without the GIL; must not throw
    {
      std::lock_guard<std::mutex> lock(s->mu);
      if (s->stopping) {
        new Job(std::move(job));  // the interpreter is going away: leak
        return;
      }
      s->inCallback = true;
    }
    {
      py::gil_scoped_acquire gil;
      try {
        job.done();
      } catch (py::error_already_set& e) {
        e.discard_as_unraisable("gflow Work callback");
      } catch (const std::exception& e) {
        PyErr_SetString(PyExc_RuntimeError, e.what());
        PyErr_WriteUnraisable(nullptr);
      }
      job = Job{};  // destroys the captured Python objects with the GIL
    }
    std::lock_guard<std::mutex> lock(s->mu);
    s->inCallback = false;
    s->cv.notify_all();
  }
}

void Completer::shutdown() {
  std::shared_ptr<State> s = state_;
  py::gil_scoped_release nogil;  // a running callback may need the GIL to finish
  std::unique_lock<std::mutex> lock(s->mu);
  s->stopping = true;
  s->cv.notify_all();
  s->cv.wait(lock, [&] { return !s->inCallback; });
  for (Job& j : s->jobs) new Job(std::move(j));  // never run, never destroyed
  s->jobs.clear();
  if (s->thread.joinable()) s->thread.detach();  // it may still be waiting on an op
}

// ---- PyWork -----------------------------------------------------------------

struct PyWork::Deferred {
  std::mutex mu;
  std::condition_variable cv;
  bool done = false;
  bool nonFinite = false;
  std::exception_ptr error;
};

PyWork::PyWork(Work work, std::vector<HeldTensor> keep)
    : work_(std::move(work)), keep_(std::make_shared<std::vector<HeldTensor>>(std::move(keep))) {}

PyWork::PyWork(std::function<bool()> deferredWait, py::object keepalive)
    : deferred_(std::make_shared<Deferred>()) {
  std::shared_ptr<Deferred> d = deferred_;
  Completer::instance().enqueue(
      [d, deferredWait] {
        bool nonFinite = false;
        std::exception_ptr error;
        try {
          nonFinite = deferredWait();
        } catch (...) {
          error = std::current_exception();
        }
        std::lock_guard<std::mutex> lock(d->mu);
        d->done = true;
        d->nonFinite = nonFinite;
        d->error = error;
        d->cv.notify_all();
      },
      [keepalive] {});  // released with the GIL once the step is over
}

PyWork::~PyWork() {
  // An op still in flight keeps its arrays alive until it completes, even
  // when the Work object is dropped (runs with the GIL: Python dealloc).
  if (work_.valid() && keep_ && !keep_->empty() && !work_.test()) {
    Work w = work_;
    std::shared_ptr<std::vector<HeldTensor>> keep = std::move(keep_);
    Completer::instance().enqueue(
        [w] {
          try {
            w.wait();
          } catch (...) {
          }
        },
        [keep] {});
  }
}

void PyWork::wait(std::chrono::milliseconds timeout) {
  if (work_.valid()) {
    py::gil_scoped_release nogil;
    work_.wait(timeout);
    return;
  }
  std::exception_ptr error;
  {
    py::gil_scoped_release nogil;
    std::unique_lock<std::mutex> lock(deferred_->mu);
    auto isDone = [&] { return deferred_->done; };
    if (timeout.count() > 0) {
      if (!deferred_->cv.wait_for(lock, timeout, isDone)) {
        throw Error(ErrorCode::kTimeout, "Work.wait: the reducer step did not finish within " +
                                             std::to_string(timeout.count()) + " ms");
      }
    } else {
      deferred_->cv.wait(lock, isDone);
    }
    error = deferred_->error;
  }
  if (error) std::rethrow_exception(error);
}

bool PyWork::test() const {
  if (work_.valid()) return work_.test();
  std::lock_guard<std::mutex> lock(deferred_->mu);
  return deferred_->done;
}

bool PyWork::nonFinite() const {
  if (work_.valid()) return work_.nonFinite();
  std::lock_guard<std::mutex> lock(deferred_->mu);
  return deferred_->nonFinite;
}

void PyWork::addDoneCallback(py::object self, py::object fn) {
  std::function<void()> wait;
  if (work_.valid()) {
    Work w = work_;
    wait = [w] {
      try {
        w.wait();
      } catch (...) {  // the callback sees it through Work.wait()
      }
    };
  } else {
    std::shared_ptr<Deferred> d = deferred_;
    wait = [d] {
      std::unique_lock<std::mutex> lock(d->mu);
      d->cv.wait(lock, [&] { return d->done; });
    };
  }
  Completer::instance().enqueue(std::move(wait), [self, fn] { fn(self); });
}

}  // namespace python
}  // namespace gflow
