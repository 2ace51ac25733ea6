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

// Views `obj` (numpy array or anything with the buffer protocol, or a CPU
// torch tensor through DLPack) without copying. Throws
// gflow::Error(kInvalidArgument) naming `what` for a non-contiguous,
// read-only (when `writable`), non-CPU or unsupported-dtype array.
HeldTensor viewTensor(py::handle obj, const char* what, bool writable);

// "sum" / "avg" / ReduceOp.SUM ...; "float16" / "bf16" / DataType / torch.float16 ...
ReduceOp toReduceOp(py::handle obj);
DataType toDataType(py::handle obj);
// None -> 0 (no limit); seconds as a number or a datetime.timedelta.
std::chrono::milliseconds toTimeout(py::handle obj);

// One thread that waits for asynchronous work and then runs Python
// callbacks with the GIL (Completer::instance()). Jobs run in FIFO order.
class Completer {
 public:
  static Completer& instance();
  // `wait` runs without the GIL (it must not touch Python objects and must
  // not throw); then `done` runs with the GIL and is destroyed with it.
  // Call with the GIL held.
  void enqueue(std::function<void()> wait, std::function<void()> done);
  // At interpreter exit (atexit): runs no further callbacks; jobs still
  // waiting are abandoned (their Python objects are leaked, not touched).
  void shutdown();

 private:
  struct Job {
    std::function<void()> wait;
    std::function<void()> done;
  };
  void run();
  struct State;
  std::shared_ptr<State> state_;
  Completer();
};

// The completion state of a Work: either a gflow::Work, or a deferred wait
// (a GradientReducer step) that the Completer runs.
class PyWork {
 public:
  PyWork(Work work, std::vector<HeldTensor> keep);
  // `deferredWait` returns nonfinite; `keepalive` (e.g. the reducer's Python
  // object, which owns the gradient arrays) lives until it has returned.
  PyWork(std::function<bool()> deferredWait, py::object keepalive);
  ~PyWork();
  void wait(std::chrono::milliseconds timeout);
  bool test() const;
  bool nonFinite() const;
  void addDoneCallback(py::object self, py::object fn);

 private:
  struct Deferred;
  Work work_;
  std::shared_ptr<std::vector<HeldTensor>> keep_;
  std::shared_ptr<Deferred> deferred_;
};

void bindErrors(py::module_& m);
void bindCommunicator(py::module_& m);
void bindReducer(py::module_& m);

}  // namespace python
}  // namespace gflow
