// Asynchronous completion for Python: the Completer thread (waits for work
// without the GIL, then runs Python callbacks with it) and PyWork, the
// state behind gflow.Work.
#include <condition_variable>
#include <deque>
#include <map>
#include <mutex>
#include <thread>

#include "bindings.h"

namespace gflow {
namespace python {

struct Completer::Lane {
  std::deque<Job> jobs;
};

struct Completer::State {
  std::mutex mu;
  std::condition_variable cv;
  std::map<const void*, std::shared_ptr<Lane>> lanes;  // those with a running thread
  bool stopping = false;
  int inCallback = 0;
};

Completer::Completer() : state_(std::make_shared<State>()) {}

Completer& Completer::instance() {
  // Leaked on purpose: it must outlive interpreter finalization.
  static Completer* c = new Completer();
  return *c;
}

void Completer::enqueue(const void* key, std::function<void()> wait, std::function<void()> done) {
  std::lock_guard<std::mutex> lock(state_->mu);
  if (state_->stopping) {
    // Interpreter exit: nothing will run; keep the Python objects alive.
    new Job{std::move(wait), std::move(done)};
    return;
  }
  std::shared_ptr<Lane>& lane = state_->lanes[key];
  const bool start = !lane;
  if (start) lane = std::make_shared<Lane>();
  lane->jobs.push_back(Job{std::move(wait), std::move(done)});
  // Detached: a lane's thread ends by itself when its queue is empty, and
  // at interpreter exit it may still be waiting on an op.
  if (start) std::thread(&Completer::run, state_, key, lane).detach();
}

void Completer::run(std::shared_ptr<State> s, const void* key, std::shared_ptr<Lane> lane) {
  for (;;) {
    Job job;
    {
      std::lock_guard<std::mutex> lock(s->mu);
      if (s->stopping) return;
      if (lane->jobs.empty()) {
        s->lanes.erase(key);  // the next job on this communicator starts a new lane
        return;
      }
      job = std::move(lane->jobs.front());
      lane->jobs.pop_front();
    }
    job.wait();  // without the GIL; must not throw
    {
      std::lock_guard<std::mutex> lock(s->mu);
      if (s->stopping) {
        new Job(std::move(job));  // the interpreter is going away: leak
        return;
      }
      ++s->inCallback;
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
    --s->inCallback;
    s->cv.notify_all();
  }
}

void Completer::shutdown() {
  std::shared_ptr<State> s = state_;
  py::gil_scoped_release nogil;  // a running callback may need the GIL to finish
  std::unique_lock<std::mutex> lock(s->mu);
  s->stopping = true;
  s->cv.wait(lock, [&] { return s->inCallback == 0; });
  for (auto& kv : s->lanes) {
    for (Job& j : kv.second->jobs) new Job(std::move(j));  // never run, never destroyed
    kv.second->jobs.clear();
  }
}

// ---- PyWork -----------------------------------------------------------------

struct PyWork::Deferred {
  std::mutex mu;
  std::condition_variable cv;
  bool done = false;
  bool nonFinite = false;
  std::exception_ptr error;
};

PyWork::PyWork(std::shared_ptr<Communicator> comm, Work work, std::vector<HeldTensor> keep,
               std::shared_ptr<int> source)
    : comm_(std::move(comm)),
      lane_(comm_.get()),
      work_(std::move(work)),
      keep_(std::make_shared<std::vector<HeldTensor>>(std::move(keep))),
      source_(std::move(source)) {}

PyWork::PyWork(const void* lane, std::function<bool()> deferredWait, py::object keepalive)
    : lane_(lane), deferred_(std::make_shared<Deferred>()) {
  std::shared_ptr<Deferred> d = deferred_;
  Completer::instance().enqueue(
      lane_,
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
  // An op still in flight keeps its arrays and its communicator alive until
  // it completes, even when the Work object is dropped (runs with the GIL:
  // Python dealloc).
  if (work_.valid() && !work_.test()) {
    Work w = work_;
    std::shared_ptr<std::vector<HeldTensor>> keep = std::move(keep_);
    std::shared_ptr<Communicator> comm = std::move(comm_);
    std::shared_ptr<int> source = std::move(source_);
    Completer::instance().enqueue(
        lane_,
        [w, comm, source] {
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

int PyWork::source() const {
  if (!source_ || !work_.valid() || !work_.test()) return -1;
  return *source_;
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
  Completer::instance().enqueue(lane_, std::move(wait), [self, fn] { fn(self); });
}

}  // namespace python
}  // namespace gflow
