// The "gflow" torch.distributed backend (_gflow_torch): on torch 2.x a
// c10d::Backend (a ProcessGroup routes each device type's ops to one; gflow
// registers for cpu and cuda), on torch 1.13 a c10d::ProcessGroup; one
// source for both (BackendBase). Its collectives run on a
// gflow::Communicator, bootstrapped through the c10d::Store that
// init_process_group hands the backend creator, on CPU and CUDA tensors:
// allreduce (and its coalesced and sparse forms), reduce, broadcast,
// allgather (list, flat and coalesced forms), gather, scatter, all-to-all
// (equal splits, split sizes and the list form), reduce_scatter (list, flat
// and coalesced forms), barrier and point-to-point (send, recv, recv from
// any source). Ops that only move data take any dtype (as bytes);
// non-contiguous tensors go through a contiguous copy. One translation unit
// on purpose: the torch headers dominate the build time.
#include <torch/csrc/utils/pybind.h>
#include <torch/version.h>
#include <torch/csrc/distributed/c10d/ProcessGroup.hpp>
#if TORCH_VERSION_MAJOR >= 2
#include <torch/csrc/distributed/c10d/Backend.hpp>
#endif
#include <torch/csrc/distributed/c10d/Store.hpp>
#include <torch/csrc/distributed/c10d/Work.hpp>

#include <pybind11/chrono.h>

#include <algorithm>
#include <cctype>
#include <condition_variable>
#include <cstring>
#include <deque>
#include <mutex>
#include <optional>
#include <thread>

#include "core/frontend.h"
#include "gflow/gflow.h"
#include "sparse_allreduce.h"

namespace gflow {
namespace torch_backend {
namespace {

[[noreturn]] void invalid(const std::string& message) {
  throw Error(ErrorCode::kInvalidArgument, "gflow backend: " + message);
}

// c10d::Store as a gflow::Store: gflow's bootstrap keys live in the store
// of init_process_group (under the prefix torch gives each group).
class C10dStore : public Store {
 public:
  explicit C10dStore(c10::intrusive_ptr<c10d::Store> store) : store_(std::move(store)) {}

  void set(const std::string& key, const std::vector<uint8_t>& value) override {
    guard("set", [&] { store_->set(key, value); });
  }
  std::vector<uint8_t> get(const std::string& key, std::chrono::milliseconds timeout) override {
    wait({key}, timeout);
    std::vector<uint8_t> value;
    guard("get", [&] { value = store_->get(key); });
    return value;
  }
  // Polls check() (which never blocks) instead of c10d's wait with a
  // timeout: in torch 1.13 a TCPStore wait that times out leaves its WAIT
  // registered on the server, whose late answer then desynchronizes the
  // client's next request. gflow waits in slices (NCCL setup, failure
  // reports), so it must never time out a c10d wait.
  void wait(const std::vector<std::string>& keys, std::chrono::milliseconds timeout) override {
    const auto deadline = std::chrono::steady_clock::now() + timeout;
    auto pause = std::chrono::milliseconds(1);
    for (;;) {
      bool ready = false;
      guard("wait", [&] { ready = store_->check(keys); });
      if (ready) return;
      const auto now = std::chrono::steady_clock::now();
      if (now >= deadline) {
        throw Error(ErrorCode::kTimeout,
                    "Timed out after " + std::to_string(timeout.count()) +
                        " ms waiting for store key '" + (keys.empty() ? std::string() : keys[0]) +
                        "'",
                    ErrorContext::forOp("store"));
      }
      std::this_thread::sleep_for(
          std::min<std::chrono::steady_clock::duration>(pause, deadline - now));
      pause = std::min(pause * 2, std::chrono::milliseconds(50));
    }
  }
  int64_t add(const std::string& key, int64_t delta) override {
    int64_t v = 0;
    guard("add", [&] { v = store_->add(key, delta); });
    return v;
  }

 private:
  // c10d's stores raise c10::Error or std::runtime_error; gflow's bootstrap
  // wants gflow::Error: a timeout as kTimeout, a lost store connection as
  // kPeerLost, anything else as kInternal.
  template <class F>
  static void guard(const char* what, F&& f) {
    std::string message;
    try {
      f();
      return;
    } catch (const Error&) {
      throw;
    } catch (const c10::Error& e) {
      message = e.what_without_backtrace();
    } catch (const std::exception& e) {
      message = e.what();
    }
    std::string lower = message;
    for (char& ch : lower) ch = static_cast<char>(std::tolower(static_cast<unsigned char>(ch)));
    auto has = [&](const char* s) { return lower.find(s) != std::string::npos; };
    ErrorCode code = ErrorCode::kInternal;
    if (has("timeout") || has("timed out")) {
      code = ErrorCode::kTimeout;
    } else if (has("connection") || has("broken pipe") || has("closed") || has("reset by peer")) {
      code = ErrorCode::kPeerLost;
    }
    throw Error(code, std::string("c10d store ") + what + ": " + message,
                ErrorContext{"bootstrap"});
  }

  c10::intrusive_ptr<c10d::Store> store_;
};

// gflow's element type of a torch dtype, if it has one.
std::optional<DataType> gflowType(at::ScalarType s) {
  switch (s) {
    case at::kFloat: return DataType::kFloat32;
    case at::kHalf: return DataType::kFloat16;
    case at::kBFloat16: return DataType::kBFloat16;
    case at::kDouble: return DataType::kFloat64;
    case at::kInt: return DataType::kInt32;
    case at::kLong: return DataType::kInt64;
    case at::kByte: return DataType::kUInt8;
    case at::kChar: return DataType::kInt8;
    case at::kShort: return DataType::kInt16;
    case at::kBool: return DataType::kBool;
    case at::kComplexFloat: return DataType::kComplex64;
    case at::kComplexDouble: return DataType::kComplex128;
    default: return std::nullopt;
  }
}

DataType toDataType(const at::Tensor& t, const char* what) {
  if (auto type = gflowType(t.scalar_type())) return *type;
  invalid(std::string(what) + ": dtype " + std::string(c10::toString(t.scalar_type())) +
          " is not supported (float32, float16, bfloat16, float64, int32, int64, uint8, int8, "
          "int16, bool, complex64, complex128)");
}

void checkPlacement(const at::Tensor& t, const char* what) {
  if (!t.device().is_cpu() && !t.device().is_cuda()) {
    invalid(std::string(what) + ": tensor on " + t.device().str() +
            "; the gflow backend takes CPU and CUDA tensors");
  }
  if (t.is_sparse()) invalid(std::string(what) + ": sparse tensors are not supported");
  if (!t.is_contiguous()) invalid(std::string(what) + ": tensor is not contiguous");
}

// The stream a cuda tensor's op is ordered after: the current torch stream
// of its device, as torch's own backends use it. Asked through Python
// (torch.cuda.current_stream): this module links only libtorch's CPU
// parts, which cannot name a CUDA stream. Called without the GIL (c10d
// releases it), from the caller's thread.
void* currentStream(const at::Tensor& t) {
  py::gil_scoped_acquire gil;
  py::object stream = py::module_::import("torch.cuda").attr("current_stream")(t.device().index());
  return reinterpret_cast<void*>(stream.attr("cuda_stream").cast<uintptr_t>());
}

// Waits for the work queued on this thread's current stream of each GPU
// that holds one of `ts` (torch.cuda.current_stream(d).synchronize()).
void syncCuda(const std::vector<at::Tensor>& ts) {
  std::vector<int> done;
  for (const at::Tensor& t : ts) {
    if (!t.is_cuda() || std::find(done.begin(), done.end(), t.device().index()) != done.end()) {
      continue;
    }
    done.push_back(t.device().index());
    py::gil_scoped_acquire gil;
    py::module_::import("torch.cuda").attr("current_stream")(done.back()).attr("synchronize")();
  }
}

// A gflow Tensor over a contiguous tensor's memory: a cuda one is on its
// GPU and the current torch stream (gflow's op waits for the work queued
// there when it is called).
Tensor over(const at::Tensor& t, size_t count, DataType dtype) {
  if (!t.device().is_cuda()) return Tensor(t.data_ptr(), count, dtype);
  return Tensor(t.data_ptr(), count, dtype, Device{DeviceType::kCUDA, t.device().index()},
                currentStream(t));
}

// A view of a contiguous CPU or CUDA tensor that gflow can use in place,
// for ops that reduce (the dtype must be one gflow reduces).
Tensor view(const at::Tensor& t, const char* what) {
  checkPlacement(t, what);
  return over(t, static_cast<size_t>(t.numel()), toDataType(t, what));
}

// For ops that only move data (broadcast, gathers, scatter, all-to-all):
// any dtype, as its bytes where gflow has no type of its own for it
// (quantized types, ...). Every rank passes the same dtype, so every rank
// describes the op the same way.
Tensor bytesView(const at::Tensor& t, const char* what) {
  checkPlacement(t, what);
  if (gflowType(t.scalar_type())) return view(t, what);
  return over(t, static_cast<size_t>(t.nbytes()), DataType::kUInt8);
}

// A contiguous tensor with `t`'s values (`t` itself when it is contiguous).
// `writeBack` runs after the op: it copies the result into a
// non-contiguous `t` (nothing for a contiguous one).
struct Dense {
  at::Tensor t;
  std::function<void()> writeBack;
};
Dense dense(const at::Tensor& t) {
  if (t.is_contiguous()) return {t, nullptr};
  at::Tensor c = t.contiguous();
  return {c, [t, c]() mutable { t.copy_(c); }};
}

#if TORCH_VERSION_MAJOR >= 2
using BackendBase = c10d::Backend;
#else
using BackendBase = c10d::ProcessGroup;
#endif

// PREMUL_SUM's factor (torch.distributed._make_nccl_premul_sum: a number,
// or a one-element tensor); nullopt for every other op.
std::optional<double> premulFactor(const c10d::ReduceOp& op) {
  if (op.op_ != c10d::ReduceOp::PREMUL_SUM) return std::nullopt;
  const auto* s = dynamic_cast<const c10d::NCCLPreMulSumSupplement*>(op.supplement_.get());
  if (!s) invalid("PREMUL_SUM without its factor");
#if TORCH_VERSION_MAJOR >= 2
  if (s->tensor_factor.defined()) return s->tensor_factor.item<double>();
#else
  if (!s->tensor_factors.empty()) return s->tensor_factors[0].item<double>();
#endif
  return s->double_factor;
}

// PREMUL_SUM: `t` (this rank's contribution, a tensor the op may change)
// times the factor, so that the sum that follows is torch's premultiplied
// sum. Nothing for other ops.
void premultiply(at::Tensor& t, const c10d::ReduceOp& op, const char* what) {
  const std::optional<double> f = premulFactor(op);
  if (!f) return;
  if (!at::isFloatingType(t.scalar_type()) && !at::isComplexType(t.scalar_type())) {
    invalid(std::string(what) + ": PREMUL_SUM applies to floating-point tensors, not " +
            std::string(c10::toString(t.scalar_type())));
  }
  at::NoGradGuard noGrad;  // the op's scaling, not a step of the caller's graph
  t.mul_(*f);
}

ReduceOp toReduceOp(const c10d::ReduceOp& op) {
  switch (op.op_) {
    case c10d::ReduceOp::SUM:
    case c10d::ReduceOp::PREMUL_SUM: return ReduceOp::kSum;  // premultiply() scales first
    case c10d::ReduceOp::AVG: return ReduceOp::kAvg;
    case c10d::ReduceOp::PRODUCT: return ReduceOp::kProd;
    case c10d::ReduceOp::MIN: return ReduceOp::kMin;
    case c10d::ReduceOp::MAX: return ReduceOp::kMax;
    case c10d::ReduceOp::BAND: return ReduceOp::kBand;
    case c10d::ReduceOp::BOR: return ReduceOp::kBor;
    case c10d::ReduceOp::BXOR: return ReduceOp::kBxor;
    default:
      invalid("reduce op " + std::to_string(static_cast<int>(op.op_)) +
              " is not supported (SUM, AVG, PRODUCT, MIN, MAX, BAND, BOR, BXOR, PREMUL_SUM)");
  }
}

// Argument errors use Gloo's phrases ("requires a single-element ... tensor
// list", "invalid tensor type", "invalid root rank", ...), which torch's
// own tests and users' scripts match on; gflow's detail follows them.
// `list` names the list for Gloo's message ("input ", "output " or "").
const at::Tensor& single(const std::vector<at::Tensor>& tensors, const char* what,
                         const char* list = "") {
  if (tensors.size() != 1) {
    invalid(std::string(what) + ": requires a single-element " + list + "tensor list (got " +
            std::to_string(tensors.size()) + " tensors)");
  }
  return tensors[0];
}

// Tensor `i` of a list against tensor 0 (`like`): layout, dtype, then shape.
void checkLike(const at::Tensor& t, const at::Tensor& like, size_t i, const char* what) {
  const std::string at = " at index " + std::to_string(i);
  if (t.layout() != like.layout()) {
    invalid(std::string(what) + ": invalid tensor layout" + at + " (expected " +
            c10::str(like.layout()) + ", got " + c10::str(t.layout()) + ")");
  }
  if (t.scalar_type() != like.scalar_type()) {
    invalid(std::string(what) + ": invalid tensor type" + at + " (expected " +
            std::string(c10::toString(like.scalar_type())) + ", got " +
            std::string(c10::toString(t.scalar_type())) + ")");
  }
  if (t.sizes() != like.sizes()) {
    invalid(std::string(what) + ": invalid tensor size" + at + " (expected " +
            c10::str(like.sizes()) + ", got " + c10::str(t.sizes()) + ")");
  }
}

void checkRootRank(int64_t root, int size, const char* what) {
  if (root < 0 || root >= size) {
    invalid(std::string(what) + ": invalid root rank: " + std::to_string(root) + " (" +
            std::to_string(size) + " ranks)");
  }
}

void checkRootTensor(int64_t root, size_t n, const char* what) {
  if (root < 0 || root >= static_cast<int64_t>(n)) {
    invalid(std::string(what) + ": invalid root tensor: " + std::to_string(root) + " (" +
            std::to_string(n) + " tensors)");
  }
}

// Gloo's several-tensors-per-call forms need the tensors alike: same dtype
// and shape (and, as everywhere here, dense CPU tensors).
void checkAlike(const std::vector<at::Tensor>& tensors, const char* what) {
  if (tensors.empty()) invalid(std::string(what) + ": requires non-empty tensor list");
  for (size_t i = 1; i < tensors.size(); ++i) checkLike(tensors[i], tensors[0], i, what);
}

// `acc` (op) `t`, element-wise, in place: the local step of a
// several-tensor allreduce (the tensors of one rank reduce like ranks do).
// bool's sum is "or" and its product "and", as gflow reduces them.
void combineInto(at::Tensor& acc, const at::Tensor& t, ReduceOp op) {
  const bool isBool = acc.scalar_type() == at::kBool;
  switch (op) {
    case ReduceOp::kSum:
    case ReduceOp::kAvg: isBool ? acc.logical_or_(t) : acc.add_(t); return;
    case ReduceOp::kProd: isBool ? acc.logical_and_(t) : acc.mul_(t); return;
    case ReduceOp::kMin: acc = at::minimum(acc, t); return;
    case ReduceOp::kMax: acc = at::maximum(acc, t); return;
    case ReduceOp::kBand: acc.bitwise_and_(t); return;
    case ReduceOp::kBor: acc.bitwise_or_(t); return;
    case ReduceOp::kBxor: acc.bitwise_xor_(t); return;
  }
}

// A c10d::Work completed by the process group's completion thread once the
// gflow op is done (and, for staged ops, the result copied out). It holds
// the op's inputs and outputs (and staging buffers) until then.
class GflowWork : public c10d::Work {
 public:
  GflowWork(int rank, c10d::OpType type, gflow::Work work, std::vector<at::Tensor> outputs,
            std::vector<at::Tensor> inputs, std::function<void()> after)
      : c10d::Work(rank, type),
        work_(std::move(work)),
        outputs_(std::move(outputs)),
        inputs_(std::move(inputs)),
        after_(std::move(after)),
        future_(c10::make_intrusive<c10::ivalue::Future>(
            c10::ListType::create(c10::TensorType::get()))) {}

  std::vector<at::Tensor> result() override { return outputs_; }
  // A receive's sender (recv, recvAnysource), written by gflow when the
  // receive completes.
  void setSource(std::shared_ptr<int> source) { source_ = std::move(source); }
  int sourceRank() const override { return source_ ? *source_ : c10d::Work::sourceRank(); }
  c10::intrusive_ptr<c10::ivalue::Future> getFuture() override { return future_; }

  // The Work is completed before its future (so that after fut.wait()
  // is_completed() holds); waiting on the Work also waits for the future,
  // so that after work.wait() the future's value is there.
  bool wait(std::chrono::milliseconds timeout) override {
    const bool ok = c10d::Work::wait(timeout);
    future_->wait();
    return ok;
  }

  bool pending() const { return !work_.test(); }

  // Gloo's future value for an op with several output lists (allgather of
  // several inputs, allgather_coalesced): the lists, of these sizes, not
  // one flat list (one list stays flat, as in Gloo). Before it is queued.
  void nestFuture(std::vector<size_t> sizes) {
    if (sizes.size() < 2) return;
    nested_ = std::move(sizes);
    future_ = c10::make_intrusive<c10::ivalue::Future>(
        c10::ListType::create(c10::ListType::create(c10::TensorType::get())));
  }

  // Completion thread: waits for the gflow op, then completes the Work and
  // its future (whose callbacks, e.g. DDP's, run here).
  void complete() {
    std::exception_ptr error;
    try {
      work_.wait();
      if (after_) {
        after_();
        // Copies into cuda outputs were queued on this thread's current
        // stream: done before the Work is (and before inputs_ is freed).
        syncCuda(outputs_);
      }
    } catch (...) {
      error = std::current_exception();
    }
    after_ = nullptr;
    inputs_.clear();
    finish(error);
    if (error) {
      future_->setError(error);
    } else if (nested_.empty()) {
      future_->markCompleted(c10::IValue(outputs_));
    } else {
      c10::List<c10::List<at::Tensor>> lists;
      size_t at = 0;
      for (size_t n : nested_) {
        c10::List<at::Tensor> list;
        for (size_t i = 0; i < n; ++i) list.push_back(outputs_[at++]);
        lists.push_back(std::move(list));
      }
      future_->markCompleted(c10::IValue(lists));
    }
  }

 private:
  gflow::Work work_;
  std::vector<at::Tensor> outputs_;
  std::vector<at::Tensor> inputs_;
  std::function<void()> after_;
  c10::intrusive_ptr<c10::ivalue::Future> future_;
  std::vector<size_t> nested_;
  std::shared_ptr<int> source_;
};

// The completion thread's queue; shared with the thread so that the thread
// may outlive the process group (destroyed from one of its own callbacks).
struct CompletionQueue {
  std::mutex mu;
  std::condition_variable cv;
  std::deque<c10::intrusive_ptr<GflowWork>> queue;
  c10::intrusive_ptr<GflowWork> current;
  bool stopping = false;

  // gflow runs a communicator's ops in issue order, so waiting in FIFO
  // order completes each work as soon as it is done.
  static void run(std::shared_ptr<CompletionQueue> q) {
    for (;;) {
      c10::intrusive_ptr<GflowWork> w;
      {
        std::unique_lock<std::mutex> lock(q->mu);
        q->current.reset();
        q->cv.wait(lock, [&] { return q->stopping || !q->queue.empty(); });
        if (q->queue.empty()) return;
        w = q->queue.front();
        q->queue.pop_front();
        q->current = w;
      }
      w->complete();
    }
  }
};

// The one tensor of an in-place reduction (allreduce, reduce): a
// contiguous stand-in, gflow's view of it and the op.
struct InPlace {
  at::Tensor t;
  Dense d;
  Tensor v;
  ReduceOp op;
};
InPlace inPlace(const std::vector<at::Tensor>& tensors, const c10d::ReduceOp& op,
                const char* what) {
  InPlace x;
  x.t = single(tensors, what);
  x.d = dense(x.t);
  x.v = view(x.d.t, what);
  x.op = toReduceOp(op);
  return x;
}

std::vector<size_t> listSizes(const std::vector<std::vector<at::Tensor>>& lists) {
  std::vector<size_t> sizes;
  for (const auto& l : lists) sizes.push_back(l.size());
  return sizes;
}

// Whether an op may work on each of `ts` in place, one view each: every
// tensor contiguous, on one device, and no two sharing memory.
bool inPlaceApart(const std::vector<at::Tensor>& ts) {
  std::vector<std::pair<uintptr_t, uintptr_t>> spans;
  for (const at::Tensor& t : ts) {
    if (!t.is_contiguous() || t.device() != ts[0].device()) return false;
    const auto begin = reinterpret_cast<uintptr_t>(t.data_ptr());
    spans.emplace_back(begin, begin + t.nbytes());
  }
  std::sort(spans.begin(), spans.end());
  for (size_t i = 1; i < spans.size(); ++i) {
    if (spans[i].first < spans[i - 1].second) return false;
  }
  return true;
}

// A copy of a contiguous tensor's bytes as a 1-D uint8 tensor, on its
// device.
at::Tensor asBytes(const at::Tensor& t) {
  if (t.is_cuda()) return t.reshape({-1}).view(at::kByte).clone();
  return at::from_blob(t.data_ptr(), {static_cast<int64_t>(t.nbytes())},
                       at::TensorOptions().dtype(at::kByte))
      .clone();
}

// Block r of `flat` (size() equal blocks) into outs[r].
void unflatten(const at::Tensor& flat, const std::vector<at::Tensor>& outs) {
  for (size_t r = 0; r < outs.size(); ++r) {
    at::Tensor o = outs[r];
    o.copy_(flat.narrow(0, static_cast<int64_t>(r) * o.numel(), o.numel()).view_as(o));
  }
}

// `flat`'s elements, in order, into the tensors `outs` (its dtype; each
// takes its own numel).
void splitInto(const at::Tensor& flat, const std::vector<at::Tensor>& outs) {
  int64_t at = 0;
  for (at::Tensor o : outs) {
    o.copy_(flat.narrow(0, at, o.numel()).view_as(o));
    at += o.numel();
  }
}

// The bytes of `flat`, in order, into the tensors `outs` (any dtypes).
void unflattenBytes(const at::Tensor& flat, const std::vector<at::Tensor>& outs) {
  const at::Tensor host = flat.is_cuda() ? flat.cpu() : flat;
  const auto* src = static_cast<const uint8_t*>(host.data_ptr());
  for (at::Tensor o : outs) {
    // On the host (flat is), then copied to `o` wherever it lives.
    at::Tensor c = at::empty(o.sizes(), o.options().device(at::kCPU));
    std::memcpy(c.data_ptr(), src, c.nbytes());
    src += c.nbytes();
    o.copy_(c);
  }
}

// alltoall_base's blocks of `t` (whose gflow view has `viewCount`
// elements: its numel, or its bytes for a dtype gflow moves as bytes): with
// no splits, size equal blocks; else splits[j] rows (dim 0) each.
void splitBlocks(const at::Tensor& t, const std::vector<int64_t>& splits, size_t viewCount,
                 const char* what, std::vector<size_t>* counts, std::vector<size_t>* offsets,
                 int size) {
  const size_t per = t.numel() > 0 ? viewCount / static_cast<size_t>(t.numel()) : 1;
  std::vector<int64_t> rows = splits;
  if (rows.empty()) {
    if (t.dim() == 0 || t.size(0) % size != 0) {
      invalid(std::string("alltoall_base: the ") + what + "'s first dimension must split into " +
              std::to_string(size) + " equal parts when no split sizes are given");
    }
    rows.assign(static_cast<size_t>(size), t.size(0) / size);
  }
  if (rows.size() != static_cast<size_t>(size) || t.dim() == 0) {
    invalid(std::string("alltoall_base: ") + what + " split sizes must have " +
            std::to_string(size) + " entries");
  }
  int64_t sum = 0;
  for (int64_t r : rows) {
    if (r < 0) invalid(std::string("alltoall_base: negative ") + what + " split size");
    sum += r;
  }
  if (sum != t.size(0)) {
    invalid(std::string("alltoall_base: ") + what + " split sizes sum to " + std::to_string(sum) +
            ", not its first dimension (" + std::to_string(t.size(0)) + ")");
  }
  const size_t rowElems = t.size(0) > 0 ? static_cast<size_t>(t.numel() / t.size(0)) : 0;
  size_t at = 0;
  for (int64_t r : rows) {
    counts->push_back(static_cast<size_t>(r) * rowElems * per);
    offsets->push_back(at);
    at += counts->back();
  }
}

class ProcessGroupGflow : public BackendBase {
 public:
  ProcessGroupGflow(const c10::intrusive_ptr<c10d::Store>& store, int rank, int size,
                    std::chrono::milliseconds timeout, int localRank, int localSize)
      : BackendBase(rank, size) {
    gflow::Options o;
    o.rank = rank;
    o.size = size;
    o.localRank = localRank;  // hints only (-1: the launcher's); see gflow/torch.py
    o.localSize = localSize;
    o.store = std::make_shared<C10dStore>(store);
    store_ = store;
    timeout_ = timeout;
    o.timeout = timeout;
    comm_ = Communicator::create(o);
    thread_ = std::thread(&CompletionQueue::run, q_);
  }

  ~ProcessGroupGflow() override {
    bool pending = false;
    {
      std::lock_guard<std::mutex> lock(q_->mu);
      q_->stopping = true;
      for (const auto& w : q_->queue) pending = pending || w->pending();
      pending = pending || (q_->current && q_->current->pending());
      q_->cv.notify_all();
    }
    // Ops still in flight fail at once (their futures with AbortedError)
    // instead of running to the deadline; the thread then drains the queue.
    if (pending) comm_->abort();
    if (std::this_thread::get_id() == thread_.get_id()) {
      thread_.detach();  // destroyed by a callback on the completion thread
      return;
    }
    // A future callback on the thread may need the GIL: never join with it.
    if (Py_IsInitialized() && PyGILState_Check()) {
      py::gil_scoped_release nogil;
      thread_.join();
    } else {
      thread_.join();
    }
  }

  const std::string getBackendName() const override { return "gflow"; }

  c10::intrusive_ptr<c10d::Work> broadcast(std::vector<at::Tensor>& tensors,
                                           const c10d::BroadcastOptions& opts) override {
    Tensor v;
    Dense d;
    at::Tensor t = checked("broadcast", [&] {
      checkRootRank(opts.rootRank, size_, "broadcast");
      checkRootTensor(opts.rootTensor, tensors.size(), "broadcast");
      checkAlike(tensors, "broadcast");
      const at::Tensor& one = tensors[static_cast<size_t>(opts.rootTensor)];
      d = dense(one);
      v = bytesView(d.t, "broadcast");
      return one;
    });
    // Several tensors (Gloo's form): tensors[rootTensor] is broadcast, then
    // copied into the others on every rank.
    std::function<void()> after = [wb = d.writeBack, t, tensors] {
      if (wb) wb();
      for (at::Tensor o : tensors) {
        if (!o.is_same(t)) o.copy_(t);
      }
    };
    return enqueue(c10d::OpType::BROADCAST,
                   comm_->broadcastAsync(v, static_cast<int>(opts.rootRank)), tensors, {d.t},
                   std::move(after));
  }

  c10::intrusive_ptr<c10d::Work> allreduce(std::vector<at::Tensor>& tensors,
                                           const c10d::AllreduceOptions& opts) override {
    if (tensors.size() == 1 && tensors[0].is_sparse()) return sparseAllreduce(tensors[0], opts);
    if (tensors.size() != 1) return allreduceMany(tensors, opts);
    InPlace x = checked("allreduce", [&] {
      InPlace i = inPlace(tensors, opts.reduceOp, "allreduce");
      premultiply(i.d.t, opts.reduceOp, "allreduce");
      return i;
    });
    return enqueue(c10d::OpType::ALLREDUCE, comm_->allreduceAsync(x.v, x.op), {x.t}, {x.d.t},
                   x.d.writeBack);
  }

  // Several tensors per call (Gloo's form): every tensor of every rank
  // reduces into one result, written into each tensor. The tensors of this
  // rank combine first, then one allreduce; avg is a sum, then one division
  // by the number of tensors in the group (integers truncate, as gflow's avg).
  c10::intrusive_ptr<c10d::Work> allreduceMany(std::vector<at::Tensor>& tensors,
                                               const c10d::AllreduceOptions& opts) {
    at::Tensor acc;
    Tensor v;
    const ReduceOp op = checked("allreduce", [&] {
      checkAlike(tensors, "allreduce");
      const ReduceOp o = toReduceOp(opts.reduceOp);
      for (const at::Tensor& t : tensors) checkPlacement(t, "allreduce");
      const DataType dt = toDataType(tensors[0], "allreduce");
      if (!supportsReduceOp(dt, o)) {
        invalid("allreduce: reduce op " + std::string(toString(o)) + " does not apply to " +
                toString(dt));
      }
      acc = tensors[0].contiguous().clone();
      for (size_t i = 1; i < tensors.size(); ++i) combineInto(acc, tensors[i], o);
      v = view(acc, "allreduce");
      premultiply(acc, opts.reduceOp, "allreduce");
      return o;
    });
    const int64_t parts = static_cast<int64_t>(tensors.size()) * size_;
    std::function<void()> after = [acc, tensors, op, parts]() mutable {
      if (op == ReduceOp::kAvg) {
        if (at::isIntegralType(acc.scalar_type(), /*includeBool=*/false)) {
          acc.div_(parts, "trunc");
        } else {
          acc.div_(parts);
        }
      }
      for (at::Tensor& t : tensors) t.copy_(acc);
    };
    const ReduceOp wireOp = op == ReduceOp::kAvg ? ReduceOp::kSum : op;
    return enqueue(c10d::OpType::ALLREDUCE, comm_->allreduceAsync(v, wireOp), tensors, {acc},
                   std::move(after));
  }

  // Gloo's way: indices and values gathered, then one coalesced sum on every
  // rank, copied into the input tensor.
  c10::intrusive_ptr<c10d::Work> sparseAllreduce(at::Tensor& t,
                                                 const c10d::AllreduceOptions& opts) {
    SparseAllreduce s = checked("allreduce", [&] {
      if (opts.reduceOp.op_ != c10d::ReduceOp::SUM) {
        invalid(
            "allreduce: unsupported reduction operation (allreduce of sparse tensors only "
            "works with ReduceOp.SUM)");
      }
      return startSparseAllreduce(*comm_, t);
    });
    return enqueue(c10d::OpType::ALLREDUCE, std::move(s.work), {t}, {s.gathered}, s.after);
  }

  // In place on the root's tensor; the other ranks' tensors are left alone.
  c10::intrusive_ptr<c10d::Work> reduce(std::vector<at::Tensor>& tensors,
                                        const c10d::ReduceOptions& opts) override {
    InPlace x = checked("reduce", [&] {
      checkRootRank(opts.rootRank, size_, "reduce");
      checkRootTensor(opts.rootTensor, 1, "reduce");
      InPlace i = inPlace(tensors, opts.reduceOp, "reduce");
      if (premulFactor(opts.reduceOp) && rank_ != opts.rootRank) {
        i.d = {i.d.t.clone(), nullptr};  // a rank's own tensor stays as it was
        i.v = view(i.d.t, "reduce");
      }
      premultiply(i.d.t, opts.reduceOp, "reduce");
      return i;
    });
    return enqueue(c10d::OpType::REDUCE,
                   comm_->reduceAsync(x.v, static_cast<int>(opts.rootRank), x.op), {x.t}, {x.d.t},
                   x.d.writeBack);
  }

  // The root passes one list of size() tensors, the others an empty list.
  c10::intrusive_ptr<c10d::Work> gather(std::vector<std::vector<at::Tensor>>& outputs,
                                        std::vector<at::Tensor>& inputs,
                                        const c10d::GatherOptions& opts) override {
    const int root = static_cast<int>(opts.rootRank);
    at::Tensor in, flat;
    Tensor vin, vflat;
    std::vector<at::Tensor> outs = checked("gather", [&] {
      checkRootRank(opts.rootRank, size_, "gather");
      in = single(inputs, "gather", "input ").contiguous();
      vin = bytesView(in, "gather");
      if (rank_ != root) {
        if (!outputs.empty()) invalid("gather: requires empty output on non-root");
        return std::vector<at::Tensor>{};
      }
      sameShapeList(outputs, in, "gather", "output");
      flat = at::empty({size_ * in.numel()}, in.options());
      vflat = bytesView(flat, "gather");
      return outputs[0];
    });
    gflow::Work w = comm_->gatherAsync(vin, vflat, root);
    std::function<void()> after;
    if (rank_ == root) after = [flat, outs] { unflatten(flat, outs); };
    return enqueue(c10d::OpType::GATHER, std::move(w), outs, {in, flat}, std::move(after));
  }

  // The root passes one list of size() tensors, the others an empty list.
  c10::intrusive_ptr<c10d::Work> scatter(std::vector<at::Tensor>& outputs,
                                         std::vector<std::vector<at::Tensor>>& inputs,
                                         const c10d::ScatterOptions& opts) override {
    const int root = static_cast<int>(opts.rootRank);
    at::Tensor out, flat;
    Tensor vout, vflat;
    Dense d;
    checked("scatter", [&] {
      checkRootRank(opts.rootRank, size_, "scatter");
      out = single(outputs, "scatter", "output ");
      d = dense(out);
      vout = bytesView(d.t, "scatter");
      if (rank_ != root) {
        if (!inputs.empty()) invalid("scatter: requires empty input on non-root");
        return;
      }
      sameShapeList(inputs, out, "scatter", "input");
      std::vector<at::Tensor> flatIn;
      for (const at::Tensor& i : inputs[0]) flatIn.push_back(i.reshape({-1}));
      flat = at::cat(flatIn);
      vflat = bytesView(flat, "scatter");
    });
    return enqueue(c10d::OpType::SCATTER, comm_->scatterAsync(vflat, vout, root), {out},
                   {flat, d.t}, d.writeBack);
  }

  // Point-to-point, one tensor per call as in Gloo; messages of one tag
  // between two ranks match in order (Communicator::send).
  c10::intrusive_ptr<c10d::Work> send(std::vector<at::Tensor>& tensors, int dstRank,
                                      int tag) override {
    at::Tensor t;
    Tensor v;
    checked("send", [&] {
      t = single(tensors, "send").contiguous();
      v = bytesView(t, "send");
    });
    return enqueue(c10d::OpType::SEND, comm_->sendAsync(v, dstRank, tag), {}, {t});
  }
  c10::intrusive_ptr<c10d::Work> recv(std::vector<at::Tensor>& tensors, int srcRank,
                                      int tag) override {
    return receive(tensors, srcRank, tag, c10d::OpType::RECV);
  }
  c10::intrusive_ptr<c10d::Work> recvAnysource(std::vector<at::Tensor>& tensors, int tag) override {
    return receive(tensors, P2POp::kAnySource, tag, c10d::OpType::RECVANYSOURCE);
  }

  // torch.distributed.batch_isend_irecv on a gflow group (gflow.torch): the
  // ops as one sendRecv call, so they start together and cannot wait for
  // one another (one NCCL group under GFLOW_NCCL_P2P); one Work for all.
  // Each op: (is a send, tensor, peer in this group, tag).
  using BatchOp = std::tuple<bool, at::Tensor, int, int>;
  c10::intrusive_ptr<c10d::Work> batchSendRecv(const std::vector<BatchOp>& ops) {
    std::vector<P2POp> p2p;
    std::vector<at::Tensor> outputs, keep;
    std::vector<std::function<void()>> writeBacks;
    checked("batch_isend_irecv", [&] {
      if (ops.empty()) invalid("batch_isend_irecv: no ops");
      for (const BatchOp& op : ops) {
        const at::Tensor& t = std::get<1>(op);
        const int peer = std::get<2>(op), tag = std::get<3>(op);
        if (std::get<0>(op)) {
          keep.push_back(t.contiguous());
          p2p.push_back(P2POp::send(bytesView(keep.back(), "batch_isend_irecv"), peer, tag));
          continue;
        }
        Dense d = dense(t);
        keep.push_back(d.t);
        outputs.push_back(t);
        if (d.writeBack) writeBacks.push_back(d.writeBack);
        p2p.push_back(P2POp::recv(bytesView(d.t, "batch_isend_irecv"), peer, tag));
      }
    });
    std::function<void()> after;
    if (!writeBacks.empty()) {
      after = [writeBacks] {
        for (const auto& w : writeBacks) w();
      };
    }
    return enqueue(c10d::OpType::RECV, comm_->sendRecvAsync(p2p), std::move(outputs),
                   std::move(keep), std::move(after));
  }

  // Block j of the input goes to rank j: equal blocks without split sizes,
  // else inSplits[j] rows (dim 0) of it (outSplits[j] rows of the output
  // come from rank j), as alltoallv.
  c10::intrusive_ptr<c10d::Work> alltoall_base(at::Tensor& out, at::Tensor& in,
                                               std::vector<int64_t>& outSplits,
                                               std::vector<int64_t>& inSplits,
                                               const c10d::AllToAllOptions&) override {
    Tensor vin, vout;
    at::Tensor cin;
    Dense d;
    std::vector<size_t> inCounts, inOffsets, outCounts, outOffsets;
    checked("alltoall", [&] {
      if (in.scalar_type() != out.scalar_type()) {
        invalid("alltoall_base: input and output must have the same dtype");
      }
      cin = in.contiguous();
      d = dense(out);
      vin = bytesView(cin, "alltoall_base");
      vout = bytesView(d.t, "alltoall_base");
      if (outSplits.empty() && inSplits.empty()) {
        if (in.numel() % size_ != 0 || out.numel() != in.numel()) {
          invalid("alltoall_base: input and output must have the same numel, a multiple of " +
                  std::to_string(size_));
        }
        return;
      }
      splitBlocks(in, inSplits, vin.count, "input", &inCounts, &inOffsets, size_);
      splitBlocks(out, outSplits, vout.count, "output", &outCounts, &outOffsets, size_);
    });
    gflow::Work w = inCounts.empty() ? comm_->alltoallAsync(vin, vout)
                                     : comm_->alltoallvAsync(vin, inCounts, inOffsets, vout,
                                                             outCounts, outOffsets);
    return enqueue(c10d::OpType::ALLTOALL_BASE, std::move(w), {out}, {cin, d.t}, d.writeBack);
  }

  // The list form: inputs[j] goes to rank j, outputs[j] comes from rank j
  // (any shapes and dtypes; each pair agrees in bytes), as one alltoallv of
  // their bytes.
  c10::intrusive_ptr<c10d::Work> alltoall(std::vector<at::Tensor>& outputs,
                                          std::vector<at::Tensor>& inputs,
                                          const c10d::AllToAllOptions&) override {
    at::Tensor in, flat;
    Tensor vin, vflat;
    std::vector<size_t> inCounts, inOffsets, outCounts, outOffsets;
    checked("alltoall", [&] {
      if (inputs.size() != static_cast<size_t>(size_) ||
          outputs.size() != static_cast<size_t>(size_)) {
        invalid("alltoall: expected " + std::to_string(size_) + " input and output tensors");
      }
      std::vector<at::Tensor> parts;
      size_t at = 0;
      for (const at::Tensor& t : inputs) {
        parts.push_back(asBytes(t.contiguous()));
        inCounts.push_back(static_cast<size_t>(t.nbytes()));
        inOffsets.push_back(at);
        at += inCounts.back();
      }
      at = 0;
      for (const at::Tensor& t : outputs) {
        outCounts.push_back(static_cast<size_t>(t.nbytes()));
        outOffsets.push_back(at);
        at += outCounts.back();
      }
      in = at::cat(parts);
      flat = at::empty({static_cast<int64_t>(at)}, at::TensorOptions().dtype(at::kByte));
      vin = bytesView(in, "alltoall");
      vflat = bytesView(flat, "alltoall");
    });
    gflow::Work w = comm_->alltoallvAsync(vin, inCounts, inOffsets, vflat, outCounts, outOffsets);
    return enqueue(c10d::OpType::ALLTOALL, std::move(w), outputs, {in, flat},
                   [flat, outs = outputs] { unflattenBytes(flat, outs); });
  }

  // Every rank's input tensors, as bytes, in one allgather; rank r's land in
  // outputs[r].
  c10::intrusive_ptr<c10d::Work> allgather_coalesced(std::vector<std::vector<at::Tensor>>& outputs,
                                                     std::vector<at::Tensor>& inputs,
                                                     const c10d::AllgatherOptions&) override {
    at::Tensor in, flat;
    Tensor vin, vflat;
    std::vector<at::Tensor> outs = checked("allgather_coalesced", [&] {
      if (outputs.size() != static_cast<size_t>(size_)) {
        invalid("allgather_coalesced: output lists should be equal to world size (" +
                std::to_string(size_) + ", got " + std::to_string(outputs.size()) + ")");
      }
      std::vector<at::Tensor> parts, all;
      for (const at::Tensor& i : inputs) parts.push_back(asBytes(i.contiguous()));
      for (const auto& list : outputs) {
        if (list.size() != inputs.size()) {
          invalid("allgather_coalesced: invalid output size: (expected length " +
                  std::to_string(inputs.size()) + ", got " + std::to_string(list.size()) +
                  "): one output tensor per input");
        }
        for (size_t k = 0; k < list.size(); ++k) {
          if (list[k].numel() != inputs[k].numel()) {
            invalid("allgather_coalesced: invalid size of output tensor at index " +
                    std::to_string(k) + " (expected " + c10::str(inputs[k].sizes()) + ", got " +
                    c10::str(list[k].sizes()) + ")");
          }
          if (list[k].scalar_type() != inputs[k].scalar_type()) {
            invalid("allgather_coalesced: invalid tensor type at index " + std::to_string(k) +
                    " (expected " + std::string(c10::toString(inputs[k].scalar_type())) + ", got " +
                    std::string(c10::toString(list[k].scalar_type())) + ")");
          }
          all.push_back(list[k]);
        }
      }
      in = parts.empty() ? at::empty({0}, at::kByte) : at::cat(parts);
      flat = at::empty({size_ * in.numel()}, in.options());
      vin = bytesView(in, "allgather_coalesced");
      vflat = bytesView(flat, "allgather_coalesced");
      return all;
    });
    gflow::Work w = comm_->allgatherAsync(vin, vflat);
    auto work = makeWork(c10d::OpType::ALLGATHER_COALESCED, std::move(w), outs, {in, flat},
                         [flat, outs] { unflattenBytes(flat, outs); });
    work->nestFuture(listSizes(outputs));
    return push(std::move(work));
  }

  // In place on the tensors where they are dense and apart; where two share
  // memory (Gloo's tests pass one tensor twice) or one is not contiguous,
  // as Gloo does: one flat copy reduced, then each tensor's slice copied
  // back.
  c10::intrusive_ptr<c10d::Work> allreduce_coalesced(
      std::vector<at::Tensor>& tensors, const c10d::AllreduceCoalescedOptions& opts) override {
    std::vector<Tensor> views;
    at::Tensor flat;
    const ReduceOp op = checked("allreduce", [&] {
      const char* what = "allreduce_coalesced";
      if (tensors.empty()) invalid(std::string(what) + ": requires non-empty tensor list");
      for (size_t i = 1; i < tensors.size(); ++i) {
        if (tensors[i].layout() != tensors[0].layout()) checkLike(tensors[i], tensors[0], i, what);
        if (tensors[i].scalar_type() != tensors[0].scalar_type()) {
          invalid(std::string(what) + ": tensors must all have the same type");
        }
      }
      if (tensors[0].is_sparse()) invalid(std::string(what) + ": unsupported layout (sparse)");
      const ReduceOp o = toReduceOp(opts.reduceOp);
      if (inPlaceApart(tensors)) {
        for (const at::Tensor& t : tensors) views.push_back(view(t, what));
        for (at::Tensor& t : tensors) premultiply(t, opts.reduceOp, what);
        return o;
      }
      std::vector<at::Tensor> parts;
      for (const at::Tensor& t : tensors) {
        checkPlacement(t.contiguous(), what);
        parts.push_back(t.reshape({-1}));
      }
      flat = at::cat(parts);
      views.push_back(view(flat, what));
      premultiply(flat, opts.reduceOp, what);
      return o;
    });
    if (!flat.defined()) {
      return enqueue(c10d::OpType::ALLREDUCE_COALESCED, allreduceCoalesced(*comm_, views, op),
                     tensors);
    }
    std::function<void()> after = [flat, outs = tensors] { splitInto(flat, outs); };
    return enqueue(c10d::OpType::ALLREDUCE_COALESCED, comm_->allreduceAsync(views[0], op), tensors,
                   {flat}, std::move(after));
  }

  c10::intrusive_ptr<c10d::Work> allgather(std::vector<std::vector<at::Tensor>>& outputs,
                                           std::vector<at::Tensor>& inputs,
                                           const c10d::AllgatherOptions&) override {
    // Several inputs (Gloo's form): k inputs, k output lists of k * size()
    // tensors; every list receives rank r's input i at r * k + i.
    at::Tensor in, flat;
    Tensor vin, vflat;
    checked("allgather", [&] {
      if (inputs.empty()) invalid("allgather: requires non-empty input tensor list");
      const size_t k = inputs.size(), want = k * static_cast<size_t>(size_);
      if (outputs.size() != k) {
        invalid("allgather: requires input/output tensor lists to have the same length (" +
                std::to_string(k) + " input(s), " + std::to_string(outputs.size()) +
                " output list(s))");
      }
      for (size_t l = 0; l < outputs.size(); ++l) {
        if (outputs[l].size() != want) {
          invalid("allgather: invalid output tensor list at index " + std::to_string(l) +
                  " (expected length " + std::to_string(want) + ", got " +
                  std::to_string(outputs[l].size()) + ": " + std::to_string(k) + " input(s) x " +
                  std::to_string(size_) + " ranks)");
        }
      }
      checkAlike(inputs, "allgather");
      for (const auto& list : outputs) {
        for (size_t i = 0; i < list.size(); ++i) checkLike(list[i], inputs[0], i, "allgather");
      }
      std::vector<at::Tensor> flatIns;
      for (const at::Tensor& t : inputs) flatIns.push_back(t.reshape({-1}));
      in = k == 1 ? inputs[0].contiguous() : at::cat(flatIns);
      vin = bytesView(in, "allgather");
      flat = at::empty({static_cast<int64_t>(want) * inputs[0].numel()}, inputs[0].options());
      vflat = bytesView(flat, "allgather");
    });
    std::vector<at::Tensor> outs;
    for (const auto& list : outputs) outs.insert(outs.end(), list.begin(), list.end());
    gflow::Work w = comm_->allgatherAsync(vin, vflat);
    auto work = makeWork(c10d::OpType::ALLGATHER, std::move(w), outs, {in, flat}, [flat, outputs] {
      for (const auto& list : outputs) unflatten(flat, list);
    });
    work->nestFuture(listSizes(outputs));
    return push(std::move(work));
  }

  c10::intrusive_ptr<c10d::Work> _allgather_base(at::Tensor& out, at::Tensor& in,
                                                 const c10d::AllgatherOptions&) override {
    Tensor vin, vout;
    checked("allgather", [&] {
      vin = bytesView(in, "_allgather_base");
      vout = bytesView(out, "_allgather_base");
    });
    return enqueue(c10d::OpType::_ALLGATHER_BASE, comm_->allgatherAsync(vin, vout), {out}, {in});
  }

  c10::intrusive_ptr<c10d::Work> reduce_scatter(std::vector<at::Tensor>& outputs,
                                                std::vector<std::vector<at::Tensor>>& inputs,
                                                const c10d::ReduceScatterOptions& opts) override {
    at::Tensor out, in, result;
    Tensor vin, vresult;
    const ReduceOp op = checked("reduce_scatter", [&] {
      out = single(outputs, "reduce_scatter");
      if (inputs.size() != 1 || inputs[0].size() != static_cast<size_t>(size_)) {
        invalid("reduce_scatter: expected one list of " + std::to_string(size_) + " input tensors");
      }
      std::vector<at::Tensor> flatIn;
      for (const at::Tensor& i : inputs[0]) {
        if (i.numel() != out.numel() || i.scalar_type() != out.scalar_type()) {
          invalid("reduce_scatter: every input tensor must have the output's numel and dtype");
        }
        flatIn.push_back(i.reshape({-1}));
      }
      in = at::cat(flatIn);
      result = out.is_contiguous() ? out : at::empty_like(out, at::MemoryFormat::Contiguous);
      vin = view(in, "reduce_scatter");
      vresult = view(result, "reduce_scatter");
      const ReduceOp o = toReduceOp(opts.reduceOp);
      premultiply(in, opts.reduceOp, "reduce_scatter");
      return o;
    });
    gflow::Work w = comm_->reduceScatterAsync(vin, vresult, op);
    std::function<void()> after;
    if (!out.is_contiguous()) after = [out, result]() mutable { out.copy_(result); };
    return enqueue(c10d::OpType::REDUCE_SCATTER, std::move(w), {out}, {in, result},
                   std::move(after));
  }

  c10::intrusive_ptr<c10d::Work> _reduce_scatter_base(
      at::Tensor& out, at::Tensor& in, const c10d::ReduceScatterOptions& opts) override {
    Tensor vin, vout;
    at::Tensor src = in;
    const ReduceOp op = checked("reduce_scatter", [&] {
      vin = view(in, "_reduce_scatter_base");
      vout = view(out, "_reduce_scatter_base");
      const ReduceOp o = toReduceOp(opts.reduceOp);
      if (premulFactor(opts.reduceOp)) {  // the caller's input stays as it was
        src = in.clone();
        premultiply(src, opts.reduceOp, "_reduce_scatter_base");
        vin = view(src, "_reduce_scatter_base");
      }
      return o;
    });
    return enqueue(c10d::OpType::_REDUCE_SCATTER_BASE, comm_->reduceScatterAsync(vin, vout, op),
                   {out}, {src});
  }

#if TORCH_VERSION_MAJOR >= 2
  // torch 2.x routes a sparse tensor's allreduce here.
  c10::intrusive_ptr<c10d::Work> allreduce_sparse(std::vector<at::Tensor>& tensors,
                                                  const c10d::AllreduceOptions& opts) override {
    at::Tensor t = checked("allreduce", [&] { return single(tensors, "allreduce_sparse"); });
    return sparseAllreduce(t, opts);
  }

  // all_gather_into_tensor under a coalescing manager: one allgather of
  // every input's bytes; output i receives rank r's input i at block r.
  c10::intrusive_ptr<c10d::Work> allgather_into_tensor_coalesced(
      std::vector<at::Tensor>& outputs, std::vector<at::Tensor>& inputs,
      const c10d::AllgatherOptions&) override {
    at::Tensor in, flat;
    Tensor vin, vflat;
    std::vector<at::Tensor> blocks = checked("allgather", [&] {
      const char* what = "allgather_into_tensor_coalesced";
      if (outputs.size() != inputs.size()) {
        invalid(std::string(what) + ": " + std::to_string(inputs.size()) + " inputs but " +
                std::to_string(outputs.size()) + " outputs");
      }
      std::vector<at::Tensor> parts;
      for (size_t i = 0; i < inputs.size(); ++i) {
        if (outputs[i].numel() != inputs[i].numel() * size_ ||
            outputs[i].scalar_type() != inputs[i].scalar_type()) {
          invalid(std::string(what) + ": output " + std::to_string(i) +
                  " must hold world size x its input's elements, of the input's dtype");
        }
        checkPlacement(outputs[i], what);
        parts.push_back(asBytes(inputs[i].contiguous()));
      }
      in = parts.empty() ? at::empty({0}, at::kByte) : at::cat(parts);
      flat = at::empty({size_ * in.numel()}, in.options());
      vin = bytesView(in, what);
      vflat = bytesView(flat, what);
      // Rank r's input i: block r of output i, in the order flat holds them.
      std::vector<at::Tensor> order;
      for (int r = 0; r < size_; ++r) {
        for (size_t i = 0; i < inputs.size(); ++i) {
          order.push_back(
              outputs[i].reshape({-1}).narrow(0, r * inputs[i].numel(), inputs[i].numel()));
        }
      }
      return order;
    });
    return enqueue(c10d::OpType::COALESCED, comm_->allgatherAsync(vin, vflat), outputs, {in, flat},
                   [flat, blocks] { unflattenBytes(flat, blocks); });
  }

  // reduce_scatter_tensor under a coalescing manager: the inputs' blocks
  // for each rank laid side by side, one reduce-scatter, then rank r's part
  // split into the outputs.
  c10::intrusive_ptr<c10d::Work> reduce_scatter_tensor_coalesced(
      std::vector<at::Tensor>& outputs, std::vector<at::Tensor>& inputs,
      const c10d::ReduceScatterOptions& opts) override {
    at::Tensor in, result;
    Tensor vin, vresult;
    const ReduceOp op = checked("reduce_scatter", [&] {
      const char* what = "reduce_scatter_tensor_coalesced";
      if (outputs.empty() || outputs.size() != inputs.size()) {
        invalid(std::string(what) + ": needs as many outputs as inputs, at least one");
      }
      std::vector<at::Tensor> byRank;
      int64_t per = 0;
      for (size_t i = 0; i < inputs.size(); ++i) {
        if (inputs[i].numel() != outputs[i].numel() * size_ ||
            inputs[i].scalar_type() != inputs[0].scalar_type() ||
            outputs[i].scalar_type() != inputs[0].scalar_type()) {
          invalid(std::string(what) + ": input " + std::to_string(i) +
                  " must hold world size x its output's elements, and every tensor one dtype");
        }
        checkPlacement(outputs[i], what);
        per += outputs[i].numel();
      }
      for (int r = 0; r < size_; ++r) {
        for (size_t i = 0; i < inputs.size(); ++i) {
          const int64_t n = outputs[i].numel();
          byRank.push_back(inputs[i].reshape({-1}).narrow(0, r * n, n));
        }
      }
      in = at::cat(byRank);
      result = at::empty({per}, in.options());
      vin = view(in, what);
      vresult = view(result, what);
      const ReduceOp o = toReduceOp(opts.reduceOp);
      premultiply(in, opts.reduceOp, what);
      return o;
    });
    std::function<void()> after = [result, outs = outputs] { splitInto(result, outs); };
    return enqueue(c10d::OpType::COALESCED, comm_->reduceScatterAsync(vin, vresult, op), outputs,
                   {in, result}, std::move(after));
  }
#endif

  c10::intrusive_ptr<c10d::Work> barrier(const c10d::BarrierOptions&) override {
    return enqueue(c10d::OpType::BARRIER, comm_->barrierAsync(), {});
  }

  // Through the group's c10d store, not the communicator, so that a rank
  // that never arrives is named without failing the group. Every rank but
  // 0 announces itself and waits for rank 0's verdict; rank 0 waits for the
  // announcements in rank order (the time left of `timeout`, or all of it
  // for each with waitAllRanks) and names the first rank that did not
  // arrive, or every one (waitAllRanks). Either way its message also lists
  // every rank missing at that moment.
  void monitoredBarrier(const c10d::BarrierOptions& opts, bool waitAllRanks) override {
    const auto timeout = opts.timeout == c10d::kUnsetTimeout ? timeout_ : opts.timeout;
    const std::string key = "gflow/monitored_barrier/" + std::to_string(monitoredCalls_++) + "/";
    if (rank_ != 0) return awaitVerdict(key, timeout);
    const auto start = std::chrono::steady_clock::now();
    std::vector<int> failed;
    for (int r = 1; r < size_; ++r) {
      auto left = timeout;
      if (!waitAllRanks) {
        left = timeout - std::chrono::duration_cast<std::chrono::milliseconds>(
                             std::chrono::steady_clock::now() - start);
        if (left.count() <= 0) {
          monitoredFailure(key, "Rank 0 timed out in monitoredBarrier after " +
                                    std::to_string(timeout.count()) + " ms" + missing(key));
        }
      }
      if (!arrived(key + std::to_string(r), left)) failed.push_back(r);
      if (!failed.empty() && !waitAllRanks) break;
    }
    if (failed.empty()) {
      store_->set(key + "verdict", std::vector<uint8_t>{'o', 'k'});
      return;
    }
    std::string which = failed.size() == 1 ? "Rank " : "Ranks ";
    for (size_t i = 0; i < failed.size(); ++i) {
      which += (i ? ", " : "") + std::to_string(failed[i]);
    }
    monitoredFailure(key, which + " failed to pass monitoredBarrier in " +
                              std::to_string(timeout.count()) + " ms" + missing(key));
  }

 private:
  // Whether `key` is set within `timeout` (<= 0: already set). Polls with
  // check(): a TCPStore wait() that times out leaves its request pending on
  // the server, whose late answer then desynchronises this client's next
  // request.
  bool arrived(const std::string& key, std::chrono::milliseconds timeout) {
    const auto deadline = std::chrono::steady_clock::now() + timeout;
    for (auto pause = std::chrono::milliseconds(1);; pause = std::min(pause * 2, kPollMax)) {
      if (store_->check({key})) return true;
      const auto now = std::chrono::steady_clock::now();
      if (now >= deadline) return false;
      std::this_thread::sleep_for(
          std::min<std::chrono::steady_clock::duration>(pause, deadline - now));
    }
  }
  static constexpr std::chrono::milliseconds kPollMax{10};

  // "; not arrived: 1, 3" for the ranks whose announcement is missing now.
  std::string missing(const std::string& key) {
    std::string list;
    for (int r = 1; r < size_; ++r) {
      if (!arrived(key + std::to_string(r), std::chrono::milliseconds(0))) {
        list += (list.empty() ? "" : ", ") + std::to_string(r);
      }
    }
    return list.empty() ? "" : "; not arrived: " + list;
  }

  // Rank 0: tells the waiting ranks, then raises.
  [[noreturn]] void monitoredFailure(const std::string& key, const std::string& what) {
    store_->set(key + "verdict", std::vector<uint8_t>(what.begin(), what.end()));
    TORCH_CHECK(false, "[Rank 0]: ", what);
  }

  void awaitVerdict(const std::string& key, std::chrono::milliseconds timeout) {
    store_->set(key + std::to_string(rank_), std::vector<uint8_t>{'1'});
    std::string verdict = "no answer within " + std::to_string(timeout.count()) + " ms";
    if (arrived(key + "verdict", timeout)) {
      const std::vector<uint8_t> v = store_->get(key + "verdict");
      verdict.assign(v.begin(), v.end());
    }
    TORCH_CHECK(verdict == "ok", "[Rank ", rank_, "]: Rank ", rank_,
                " successfully reached monitoredBarrier, but received errors while waiting for "
                "send/recv from rank 0: ",
                verdict);
  }

  // `lists` is one list of size() tensors, each with `like`'s dtype and
  // numel. `what` is "input" or "output" (Gloo's messages).
  void sameShapeList(const std::vector<std::vector<at::Tensor>>& lists, const at::Tensor& like,
                     const char* op, const char* what) {
    const std::string n = std::to_string(size_);
    if (lists.size() != 1) {
      invalid(std::string(op) + ": requires a single-element " + what +
              " list containing a list with " + n + " tensors (the root's)");
    }
    if (lists[0].size() != static_cast<size_t>(size_)) {
      std::string list = what;
      list[0] = static_cast<char>(std::toupper(static_cast<unsigned char>(list[0])));
      invalid(std::string(op) + ": Incorrect " + what + " list size " +
              std::to_string(lists[0].size()) + ". " + list + " list size should be " + n +
              ", same as size of the process group.");
    }
    for (size_t i = 0; i < lists[0].size(); ++i) {
      const at::Tensor& t = lists[0][i];
      if (t.scalar_type() != like.scalar_type()) checkLike(t, like, i, op);
      if (t.numel() != like.numel()) {
        invalid(std::string(op) + ": invalid tensor size at index " + std::to_string(i) +
                " (expected " + c10::str(like.sizes()) + ", got " + c10::str(t.sizes()) + ")");
      }
    }
  }

  // Runs an op's argument checks: any error goes through
  // frontend::rejectInvalidArgument, which names `op` and the problem. A
  // collective is rejected and the group stays usable (peers that run the
  // op raise at once); a send or recv fails the group.
  template <class F>
  auto checked(const char* op, F&& f) -> decltype(f()) {
    try {
      return f();
    } catch (const Error& e) {
      if (e.code() != ErrorCode::kInvalidArgument || !e.op().empty()) throw;
      gflow::frontend::rejectInvalidArgument(*comm_, op, e.detail());
    } catch (const c10::Error& e) {
      gflow::frontend::rejectInvalidArgument(
          *comm_, op, std::string("gflow backend: ") + e.what_without_backtrace());
    } catch (const std::exception& e) {
      gflow::frontend::rejectInvalidArgument(*comm_, op, std::string("gflow backend: ") + e.what());
    }
  }

  c10::intrusive_ptr<c10d::Work> receive(std::vector<at::Tensor>& tensors, int srcRank, int tag,
                                         c10d::OpType type) {
    at::Tensor out;
    Dense d;
    Tensor v;
    checked("recv", [&] {
      out = single(tensors, "recv");
      d = dense(out);
      v = bytesView(d.t, "recv");
    });
    auto source = std::make_shared<int>(-1);
    auto work =
        makeWork(type, comm_->recvAsync(v, srcRank, tag, source.get()), {out}, {d.t}, d.writeBack);
    work->setSource(std::move(source));
    return push(std::move(work));
  }

  c10::intrusive_ptr<c10d::Work> enqueue(c10d::OpType type, gflow::Work w,
                                         std::vector<at::Tensor> outputs,
                                         std::vector<at::Tensor> inputs = {},
                                         std::function<void()> after = nullptr) {
    return push(
        makeWork(type, std::move(w), std::move(outputs), std::move(inputs), std::move(after)));
  }
  c10::intrusive_ptr<GflowWork> makeWork(c10d::OpType type, gflow::Work w,
                                         std::vector<at::Tensor> outputs,
                                         std::vector<at::Tensor> inputs,
                                         std::function<void()> after) {
    return c10::make_intrusive<GflowWork>(rank_, type, std::move(w), std::move(outputs),
                                          std::move(inputs), std::move(after));
  }
  c10::intrusive_ptr<c10d::Work> push(c10::intrusive_ptr<GflowWork> work) {
    std::lock_guard<std::mutex> lock(q_->mu);
    q_->queue.push_back(work);
    q_->cv.notify_all();
    return work;
  }

  std::shared_ptr<Communicator> comm_;
  c10::intrusive_ptr<c10d::Store> store_;  // monitoredBarrier's
  std::chrono::milliseconds timeout_;
  uint64_t monitoredCalls_ = 0;
  std::shared_ptr<CompletionQueue> q_ = std::make_shared<CompletionQueue>();
  std::thread thread_;
};

}  // namespace
}  // namespace torch_backend
}  // namespace gflow

PYBIND11_MODULE(_gflow_torch, m) {
  m.doc() = "gflow's torch.distributed backend (use gflow.torch)";
  m.def(
      "create_process_group",
      [](const c10::intrusive_ptr<c10d::Store>& store, int rank, int size,
         std::chrono::milliseconds timeout, int localRank,
         int localSize) -> c10::intrusive_ptr<gflow::torch_backend::BackendBase> {
        return c10::make_intrusive<gflow::torch_backend::ProcessGroupGflow>(
            store, rank, size, timeout, localRank, localSize);
      },
      py::arg("store"), py::arg("rank"), py::arg("size"), py::arg("timeout"),
      py::arg("local_rank") = -1, py::arg("local_size") = -1,
      py::call_guard<py::gil_scoped_release>());
  m.def(
      "batch_send_recv",
      // torch 2.x: the group's cpu Backend (gflow/torch.py passes it).
      [](const c10::intrusive_ptr<gflow::torch_backend::BackendBase>& pg,
         const std::vector<gflow::torch_backend::ProcessGroupGflow::BatchOp>& ops)
          -> c10::intrusive_ptr<c10d::Work> {
        auto* g = dynamic_cast<gflow::torch_backend::ProcessGroupGflow*>(pg.get());
        if (!g) throw gflow::Error(gflow::ErrorCode::kInvalidArgument, "not a gflow process group");
        return g->batchSendRecv(ops);
      },
      py::arg("pg"), py::arg("ops"), py::call_guard<py::gil_scoped_release>());
}
