// Internal declarations shared by the translation units of the _gflow
// extension module (python/src/). Nothing here is public API: Python code
// uses the gflow package (python/gflow/), which wraps this module.
#pragma once

#include <pybind11/pybind11.h>

#include <chrono>
#include <functional>
#include <memory>
#include <optional>
#include <vector>

#include "core/frontend.h"
#include "gflow/gflow.h"

namespace gflow {
namespace python {

namespace py = pybind11;

// A Python array viewed as a gflow::Tensor, with what keeps its memory
// alive: the object itself and, for the buffer protocol, the exported
// buffer (which also stops numpy from resizing it), or for DLPack the
// capsule (its deleter runs when the capsule dies). Destroy with the GIL.
struct HeldTensor {
  Tensor tensor;
  py::object owner;
  std::shared_ptr<py::buffer_info> buffer;
  py::object capsule;
};

// Views `obj` (numpy array or anything with the buffer protocol, or a torch
// tensor through DLPack) without copying. CUDA memory (DLPack device type 2)
// becomes a cuda Tensor on the legacy default stream, which the producer
// was asked to order after its own work (__dlpack__(stream=1)). Throws
// gflow::Error(kInvalidArgument) naming `what` for a non-contiguous,
// read-only (when `writable`), unsupported-device or unsupported-dtype
// array.
HeldTensor viewTensor(py::handle obj, const char* what, bool writable);

// Runs the argument checks (and conversions) `f` of the front end's `op` on
// `comm`: an argument error, or any other error converting an argument,
// goes through frontend::rejectInvalidArgument and is raised as
// InvalidArgumentError. A collective is rejected: the communicator stays
// usable, and peers that run the op raise MismatchError at once instead of
// waiting for their deadline. A send or recv fails the communicator (its
// peer raises PeerLostError). Call with the GIL held.
template <class F>
auto checkArgs(Communicator& comm, const char* op, F&& f) -> decltype(f()) {
  try {
    return f();
  } catch (const Error& e) {
    // An error that names its op came from the library, which has already
    // rejected the op or failed the communicator.
    if (e.code() != ErrorCode::kInvalidArgument || !e.op().empty()) throw;
    gflow::frontend::rejectInvalidArgument(comm, op, e.detail());
  } catch (py::error_already_set& e) {
    const std::string what = e.what();
    gflow::frontend::rejectInvalidArgument(comm, op, what);
  } catch (const std::exception& e) {
    gflow::frontend::rejectInvalidArgument(comm, op, e.what());
  }
}

// "sum" / "avg" / ReduceOp.SUM ...; "float16" / "bf16" / DataType / torch.float16 ...
ReduceOp toReduceOp(py::handle obj);
DataType toDataType(py::handle obj);
// None -> 0 (no limit); seconds as a number or a datetime.timedelta.
std::chrono::milliseconds toTimeout(py::handle obj);

// Waits for asynchronous work and then runs Python callbacks with the GIL
// (Completer::instance()): one lane (thread) per communicator, started on
// demand and ended when its queue is empty, so that an op still running on
// one communicator never delays another communicator's callbacks. Jobs of
// one lane run in FIFO order (a communicator's ops complete in issue order).
class Completer {
 public:
  static Completer& instance();
  // `wait` runs without the GIL (it must not touch Python objects and must
  // not throw); then `done` runs with the GIL and is destroyed with it.
  // `lane` names the communicator the job waits on. Call with the GIL held.
  void enqueue(const void* lane, std::function<void()> wait, std::function<void()> done);
  // At interpreter exit (atexit): runs no further callbacks; jobs still
  // waiting are abandoned (their Python objects are leaked, not touched).
  void shutdown();

 private:
  struct Job {
    std::function<void()> wait;
    std::function<void()> done;
  };
  struct Lane;
  struct State;
  static void run(std::shared_ptr<State> s, const void* key, std::shared_ptr<Lane> lane);
  std::shared_ptr<State> state_;
  Completer();
};

// The completion state of a Work: either a gflow::Work, or a deferred wait
// (a GradientReducer step) that the Completer runs.
class PyWork {
 public:
  // Keeps `comm` (and the arrays) alive until the op has completed.
  // `source`: a receive's sender, written by the op when it completes.
  PyWork(std::shared_ptr<Communicator> comm, Work work, std::vector<HeldTensor> keep,
         std::shared_ptr<int> source = nullptr);
  // `deferredWait` returns nonfinite; `keepalive` (e.g. the reducer's Python
  // object, which owns the gradient arrays and its communicator) lives until
  // it has returned. `lane`: the communicator it waits on.
  PyWork(const void* lane, std::function<bool()> deferredWait, py::object keepalive);
  ~PyWork();
  void wait(std::chrono::milliseconds timeout);
  bool test() const;
  bool nonFinite() const;
  // A receive's sender once it has completed; -1 before, on failure, and for
  // other ops.
  int source() const;
  void addDoneCallback(py::object self, py::object fn);

 private:
  struct Deferred;
  std::shared_ptr<Communicator> comm_;
  const void* lane_ = nullptr;
  Work work_;
  std::shared_ptr<std::vector<HeldTensor>> keep_;
  std::shared_ptr<int> source_;  // outlives the op, as keep_ does
  std::shared_ptr<Deferred> deferred_;
};

void bindErrors(py::module_& m);
void bindCommunicator(py::module_& m);
void bindReducer(py::module_& m);

}  // namespace python
}  // namespace gflow
