#include "backend/nccl/nccl_backend.h"

#include <algorithm>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <limits>
#include <thread>

#include "backend/device_buffers.h"
#include "backend/hierarchical/hierarchical.h"
#include "common/check.h"
#include "common/logging.h"
#include "common/params.h"
#include "cuda/device_guard.h"
#include "transport/contract.h"

namespace gflow::backend {
namespace {

using Clock = std::chrono::steady_clock;

// How often a waiting rank reads the peers' failure reports in the store.
constexpr std::chrono::milliseconds kReportPoll{100};
// How long an op that NCCL failed with a remote error waits for the failed
// peer's own report (a process that died writes none: its survivors raise
// NCCL's error that much later).
constexpr std::chrono::milliseconds kReportGrace{500};

std::string hex(uint64_t v) {
  char b[17];
  std::snprintf(b, sizeof(b), "%016llx", static_cast<unsigned long long>(v));
  return b;
}

// The pause between two polls of a wait that began at `start`: yields for
// the first millisecond, then sleeps a sixteenth of the time waited so far
// (50 us to 1 ms). So an op is noticed within about 6% of its duration
// (plus the kernel's timer slack) and a long wait costs little CPU. Counting
// polls instead (64 yields, then 50 us sleeps) returned a 75 us NCCL op on
// an H200 after about 150 us.
void backoff(Clock::time_point start) {
  const auto waited = Clock::now() - start;
  if (waited < std::chrono::milliseconds(1)) {
    std::this_thread::yield();
    return;
  }
  const auto slice = std::chrono::duration_cast<std::chrono::microseconds>(waited / 16);
  std::this_thread::sleep_for(
      std::clamp(slice, std::chrono::microseconds(50), std::chrono::microseconds(1000)));
}

ErrorCode codeOf(int result) {
  // A remote or system error is NCCL losing a connection to a peer.
  return result == nccl::kRemoteError || result == nccl::kSystemError ? ErrorCode::kPeerLost
                                                                      : ErrorCode::kInternal;
}

}  // namespace

NcclBackend::NcclBackend(NcclSetup setup) : s_(std::move(setup)) {}

NcclBackend::~NcclBackend() {
  if (plugin_ && api_ && revoked_) {
    cuda::DeviceGuard g(*plugin_, device_);
    dropRevoked();
  }
  if (!plugin_ || !api_ || !comm_) {
    if (plugin_ && event_) plugin_->eventDestroy(event_);
    if (plugin_ && stream_) plugin_->streamDestroy(stream_);
    if (plugin_ && barrierWord_) plugin_->deviceFree(barrierWord_);
    return;
  }
  cuda::DeviceGuard g(*plugin_, device_);
  if (failed_) {
    abortComms();
    dropRevoked();
  } else {
    // Clean exit: flush (a peer may still be receiving this rank's last
    // sends through NCCL's proxy), then free; abort when that fails.
    hierarchical_.store(nullptr, std::memory_order_release);
    hier_.reset();  // its parts finalize first
    const Deadline d = Deadline::after(std::min(s_.timeout, std::chrono::milliseconds(30000)));
    const int r = finalize(comm_, d);
    if (r == nccl::kSuccess) {
      api_->commDestroy(comm_);
    } else {
      GFLOW_LOG(WARN) << "rank " << s_.rank << ": an NCCL communicator did not finalize ("
                      << api_->getErrorString(r) << "); aborting it";
      api_->commAbort(comm_);
    }
    comm_ = nullptr;
  }
  if (event_) plugin_->eventDestroy(event_);
  if (stream_) plugin_->streamDestroy(stream_);
  if (barrierWord_) plugin_->deviceFree(barrierWord_);
}

int NcclBackend::finalize(void* comm, const Deadline& d) {
  int r = api_->commFinalize(comm);
  for (const Clock::time_point start = Clock::now(); r == nccl::kInProgress;) {
    if (d.expired()) return nccl::kInProgress;
    backoff(start);
    int a = nccl::kSuccess;
    const int q = api_->commGetAsyncError(comm, &a);
    r = q != nccl::kSuccess ? q : a;
  }
  return r;
}

namespace {

// Whether NCCL can run `d`: data movement always (it moves bytes, whatever
// the type: byteCount); a reduction on the types and ops NCCL has.
bool ncclHas(const OpDesc& d) {
  const bool reduces =
      d.kind == OpKind::kAllreduce || d.kind == OpKind::kReduceScatter || d.kind == OpKind::kReduce;
  if (!reduces) return true;
  switch (d.dtype) {
    case DataType::kInt16:
    case DataType::kBool:
    case DataType::kComplex64:
    case DataType::kComplex128:
    case DataType::kQInt8:
    case DataType::kQInt4: return false;
    default: break;
  }
  return d.op != ReduceOp::kBand && d.op != ReduceOp::kBor && d.op != ReduceOp::kBxor;
}

// Data movement as bytes: every gflow type then runs on NCCL.
size_t byteCount(const OpDesc& d) {
  return d.count * dataTypeSize(d.dtype);
}

}  // namespace

bool NcclBackend::use(const Op& op, const cuda::Plugin& plugin, int device) {
  if (state_ == State::kUndecided) {
    plugin_ = &plugin;
    try {
      decide(op, device);
    } catch (...) {
      if (state_ == State::kDeciding) state_ = State::kBroken;
      throw;
    }
  }
  if (state_ == State::kStaged) return false;
  // Reductions on the types and ops NCCL has (not int16, bool or complex;
  // no bitwise ops); data movement always. Point-to-point is staged.
  if (op.desc.kind == OpKind::kPointToPoint || !ncclHas(op.desc)) return false;
  if (state_ == State::kBroken) {
    GFLOW_THROW(kInternal, ErrorContext().withSeq(op.seq).withRank(s_.rank))
        << "the NCCL communicator failed earlier on this rank";
  }
  return true;
}

bool NcclBackend::stagedByConfiguration() const {
  return (s_.mode.empty() ? params::deviceBackend() : s_.mode) == "staged";
}

void NcclBackend::decide(const Op& op, int device) {
  state_ = State::kDeciding;  // a failure from here on is reported to the peers
  const std::string mode = s_.mode.empty() ? params::deviceBackend() : s_.mode;
  if (mode != "auto" && mode != "nccl" && mode != "staged") {
    GFLOW_THROW(kInvalidArgument, ErrorContext().withSeq(op.seq).withRank(s_.rank))
        << "GFLOW_DEVICE_BACKEND is '" << mode << "'; expected auto, nccl or staged";
  }
  std::string why;
  if (mode == "staged") {
    why = "the device backend is 'staged' (Options::device.backend or GFLOW_DEVICE_BACKEND)";
  } else if (!plugin_->nccl) {
    why = "the CUDA component has no NCCL table";
  } else {
    const char* w = nullptr;
    api_ = plugin_->nccl(&w);
    if (!api_) why = w ? w : "NCCL could not be loaded";
  }
  std::string gpu = "cuda:" + std::to_string(device);
  char bus[64] = {};
  if (plugin_->pciBusId && plugin_->pciBusId(device, bus, sizeof(bus) - 1) == 0 && bus[0]) {
    gpu = bus;
  }
  // One record per rank: "1 <host> <gpu>" or "0 <why>".
  const std::string key = s_.prefix + "nccl/rank";
  const std::string mine = why.empty() ? "1 " + hex(s_.hostOf[s_.rank]) + " " + gpu : "0 " + why;
  s_.store->setString(key + std::to_string(s_.rank), mine);
  std::vector<std::string> all(s_.size);
  for (int r = 0; r < s_.size; ++r) {
    const std::string what = "rank " + std::to_string(r) +
                             " reaching this communicator's first op on cuda tensors (where "
                             "the ranks choose NCCL or staging)";
    const std::vector<uint8_t> v = waitForKey(op, key + std::to_string(r), what.c_str());
    all[r] = transport::printable(reinterpret_cast<const char*>(v.data()), v.size());
  }
  std::string blocker;  // why NCCL cannot run, naming the rank
  for (int r = 0; r < s_.size && blocker.empty(); ++r) {
    if (all[r].rfind("1 ", 0) != 0) {
      blocker = "rank " + std::to_string(r) + ": " +
                (all[r].size() > 2 ? all[r].substr(2) : std::string("(no reason given)"));
    }
    for (int q = 0; q < r && blocker.empty(); ++q) {
      if (all[q] == all[r]) {
        blocker = "ranks " + std::to_string(q) + " and " + std::to_string(r) +
                  " use the same GPU (" + all[r].substr(all[r].rfind(' ') + 1) +
                  "), which NCCL does not allow";
      }
    }
  }
  if (!blocker.empty()) {
    if (mode == "nccl") {
      GFLOW_THROW(kInvalidArgument, ErrorContext().withSeq(op.seq).withRank(s_.rank))
          << "the device backend is 'nccl' (Options::device.backend or GFLOW_DEVICE_BACKEND), "
             "but NCCL cannot run this communicator: "
          << blocker;
    }
    if (s_.rank == 0) {
      GFLOW_LOG(INFO) << "cuda tensors are staged through host memory (not NCCL: " << blocker
                      << ")";
    }
    state_ = State::kStaged;
    return;
  }
  device_ = device;
  state_ = State::kBroken;  // until start() succeeds
  try {
    start(op);
  } catch (...) {
    abortComms();
    throw;
  }
  state_ = State::kNccl;
  if (s_.rank == 0) {
    GFLOW_LOG(INFO) << "cuda tensors run on NCCL " << api_->version / 10000 << "."
                    << api_->version / 100 % 100 << "." << api_->version % 100 << " (" << s_.size
                    << " ranks" << (hier_ ? ", hierarchical allreduce" : "") << ")";
  }
}

void NcclBackend::start(const Op& op) {
  cuda::DeviceGuard g(*plugin_, device_);
  nccl::UniqueId id{};
  const std::string key = s_.prefix + "nccl/id";
  if (s_.rank == 0) {
    check(op, nullptr, "ncclGetUniqueId", api_->getUniqueId(&id));
    s_.store->set(key, std::vector<uint8_t>(id.bytes, id.bytes + sizeof(id.bytes)));
  } else {
    const std::vector<uint8_t> v = waitForKey(op, key, "rank 0 publishing the NCCL unique id");
    if (v.size() != sizeof(id.bytes)) {
      GFLOW_THROW(kInternal, ErrorContext().withSeq(op.seq).withRank(s_.rank).withPeer(0))
          << "the NCCL unique id in the store has " << v.size() << " bytes, expected "
          << sizeof(id.bytes);
    }
    std::memcpy(id.bytes, v.data(), v.size());
  }
  const int r = api_->commInitRank(&comm_, s_.size, &id, s_.rank);
  if (r != nccl::kSuccess && r != nccl::kInProgress) failNccl(op, r, "ncclCommInitRank", comm_);
  waitReady(op, comm_, "ncclCommInitRank");
  prepare(op);
}

namespace {

// The hierarchical composition over NCCL's parts with the op check in front
// of each op (its phases are several NCCL ops, each on a part of the ranks).
class CheckedFirst final : public Backend {
 public:
  CheckedFirst(std::unique_ptr<Backend> inner, const NcclOpCheck* check)
      : inner_(std::move(inner)), check_(check) {}
  void allreduce(const Op& op, const void* in, void* out) override {
    checked(op).allreduce(op, in, out);
  }
  void reduceScatter(const Op& op, const void* in, void* out) override {
    checked(op).reduceScatter(op, in, out);
  }
  void allgather(const Op& op, const void* in, void* out) override {
    checked(op).allgather(op, in, out);
  }
  void broadcast(const Op& op, void* buf) override { checked(op).broadcast(op, buf); }
  void barrier(const Op& op) override { checked(op).barrier(op); }
  const char* name() const override { return inner_->name(); }
  void abort(const Error& error) override { inner_->abort(error); }
  void notifyPeers(const Error& error) override { inner_->notifyPeers(error); }
  PeerStats peerStats(int peer) const override { return inner_->peerStats(peer); }
  void registerMemory(void* data, size_t bytes,
                      std::vector<std::unique_ptr<transport::MemoryRegion>>* out) override {
    inner_->registerMemory(data, bytes, out);
  }

 private:
  Backend& checked(const Op& op) {
    if (check_) check_->run(op, {});
    return *inner_;
  }
  std::unique_ptr<Backend> inner_;
  const NcclOpCheck* check_;
};

}  // namespace

void NcclBackend::prepare(const Op& op) {
  if (int e = plugin_->eventCreate(&event_)) failCuda(op, e, "creating the NCCL op event");
  if (int e = plugin_->streamCreate(&stream_)) failCuda(op, e, "creating the NCCL stream");
  const Hierarchy h = Hierarchy::fromHostHashes(s_.rank, s_.hostOf);
  if (h.numHosts > 1 && h.numHosts < s_.size && h.uniform) {
    // The hierarchical allreduce over an intra-host and a cross-host part,
    // each an NCCL communicator split off this one.
    auto local = part(op, h.host(), s_.rank, h.localRank(), h.localSize(), "intra-host");
    auto cross = part(op, h.localRank(), h.host(), h.host(), h.numHosts, "cross-host");
    intra_ = local.get();
    cross_ = cross.get();
    const auto nccl = [](OpKind, uint64_t, int) { return Route{Path::kNccl, Algorithm::kAuto}; };
    hier_ = std::make_unique<CheckedFirst>(
        createHierarchicalBackend(h, std::move(local), std::move(cross), PhaseRoutes{nccl, nccl},
                                  std::numeric_limits<uint64_t>::max()),  // NCCL pipelines itself
        check_.get());
    hierarchical_.store(hier_.get(), std::memory_order_release);
  }
}

void* NcclBackend::splitComm(const Op& op, int color, int key, const char* what) {
  void* comm = nullptr;
  check(op, comm_, what, api_->commSplit(comm_, color, key, &comm));
  if (comm) waitReady(op, comm, what);
  waitReady(op, comm_, what);
  return comm;
}

void NcclBackend::adopt(const Op& op, const NcclBackend& from, void* comm, const char* pending) {
  plugin_ = from.plugin_;
  api_ = from.api_;
  device_ = from.device_;
  comm_ = comm;
  state_ = State::kBroken;                    // until ready and prepared
  if (pending) waitReady(op, comm, pending);  // a failure aborts comm
  try {
    prepare(op);
  } catch (...) {
    abortComms();
    throw;
  }
  state_ = State::kNccl;
}

std::unique_ptr<NcclBackend> NcclBackend::part(const Op& op, int color, int key, int rank, int size,
                                               const char* what) {
  const std::string name = std::string("ncclCommSplit (") + what + ")";
  void* comm = splitComm(op, color, key, name.c_str());
  GFLOW_ENFORCE(comm != nullptr);
  // The part shares the communicator's store keys, so a failure report
  // reaches its waits too; its own ranks are those of its group.
  auto p =
      std::make_unique<NcclBackend>(NcclSetup{rank, size, s_.store, s_.prefix, s_.timeout,
                                              std::vector<uint64_t>(size_t(size), 0), s_.mode});
  p->part_ = true;
  p->adopt(op, *this, comm);
  return p;
}

void NcclBackend::splitInto(const Op& op, int color, int key, Backend* into) {
  if (state_ != State::kNccl) return;
  auto* child = into ? dynamic_cast<NcclBackend*>(into) : nullptr;
  GFLOW_ENFORCE(into == nullptr || child != nullptr);
  cuda::DeviceGuard g(*plugin_, device_);
  void* comm = splitComm(op, color, key, "ncclCommSplit");
  if (!child || !comm) {
    if (comm) api_->commAbort(comm);  // not ours to keep (cannot happen with color < 0)
    return;
  }
  child->adopt(op, *this, comm);
}

bool NcclBackend::canShrink() const {
  return api_ && api_->commShrink && !shrinkFailed_ &&
         ((state_ == State::kNccl && comm_) || revoked_);
}

void NcclBackend::shrinkInto(const Op& op, const std::vector<int>& excluded, bool failed,
                             Backend* into) {
  auto* child = dynamic_cast<NcclBackend*>(into);
  GFLOW_ENFORCE(child != nullptr && canShrink() && !excluded.empty());
  cuda::DeviceGuard g(*plugin_, device_);
  child->state_ = State::kBroken;  // until adopted: its failure report reaches the others
  // This backend's own waits would raise its failure: the new
  // communicator's wait for the call, under its store keys, instead.
  void* parent = revoked_ ? revoked_ : comm_;
  void* comm = nullptr;
  try {
    if (revoked_) quiesce(op);
    const int r =
        api_->commShrink(parent, excluded.data(), static_cast<int>(excluded.size()), &comm, failed);
    if (r != nccl::kSuccess && r != nccl::kInProgress) {
      throw ncclError(op, r, "ncclCommShrink", parent);
    }
    GFLOW_ENFORCE(comm != nullptr);
    void* handed = comm;
    comm = nullptr;  // the child's from here: it aborts it on failure
    child->adopt(op, *this, handed, "ncclCommShrink");
  } catch (const Error& e) {
    if (comm) api_->commAbort(comm);
    // Nothing to shrink from any more (a healthy communicator here stays
    // as it is); the members waiting in the new part hear of it now, and
    // the next attempt starts NCCL anew on every member.
    shrinkFailed_ = true;
    dropRevoked();
    child->notifyPeers(e);
    throw Error(ErrorCode::kPeerLost,
                "ncclCommShrink failed on rank " + std::to_string(s_.rank) +
                    " of the old communicator (" + e.detail() +
                    "); the survivors start a new NCCL communicator instead",
                ErrorContext().withSeq(op.seq).withRank(s_.rank));
  }
  dropRevoked();  // its part is the child's now; its own resources go
}

void NcclBackend::quiesce(const Op& op) {
  const Clock::time_point start = Clock::now();
  for (;;) {
    int a = nccl::kSuccess;
    if (int r = api_->commGetAsyncError(revoked_, &a)) {
      failNccl(op, r, "ncclCommGetAsyncError (a revoked communicator)", revoked_);
    }
    if (a != nccl::kInProgress) return;
    if (op.deadline.expired()) {
      GFLOW_THROW(kTimeout, ErrorContext().withSeq(op.seq).withRank(s_.rank))
          << "the revoked NCCL communicator did not quiesce within the deadline (GFLOW_TIMEOUT, "
          << s_.timeout.count() << " ms)";
    }
    backoff(start);
  }
}

std::vector<uint8_t> NcclBackend::waitForKey(const Op& op, const std::string& key,
                                             const char* what) {
  // In slices, so abort() and the peers' failure reports end the wait.
  Clock::time_point poll = Clock::now() - kReportPoll;
  for (;;) {
    const int slice = std::max(1, std::min(100, op.deadline.remainingMs()));
    try {
      return s_.store->get(key, std::chrono::milliseconds(slice));
    } catch (const Error& e) {
      if (e.code() != ErrorCode::kTimeout) throw;
    }
    checkWaiting(op, op.deadline, what, &poll);
  }
}

void NcclBackend::check(const Op& op, void* comm, const char* what, int result) {
  if (result == nccl::kInProgress && comm) {
    waitReady(op, comm, what);
  } else if (result != nccl::kSuccess && result != nccl::kInProgress) {
    failNccl(op, result, what, comm);
  }
}

void NcclBackend::waitReady(const Op& op, void* comm, const char* what) {
  const Clock::time_point start = Clock::now();
  Clock::time_point poll = start;
  for (;;) {
    int a = nccl::kSuccess;
    if (int r = api_->commGetAsyncError(comm, &a)) failNccl(op, r, "ncclCommGetAsyncError", comm);
    if (a == nccl::kSuccess) return;
    if (a != nccl::kInProgress) failNccl(op, a, what, comm);
    checkWaiting(op, op.deadline, what, &poll);
    backoff(start);
  }
}

namespace {

// The event after the work producing the op's inputs (null: none).
void* readyEvent(const Op& op) {
  int device = -1;
  void* ready = nullptr;
  if (op.buffers) op.buffers->single(&device, &ready);
  return ready;
}

}  // namespace

void NcclBackend::begin(const Op& op) {
  void* ready = readyEvent(op);
  if (!ready) return;
  if (int e = plugin_->streamWaitEvent(stream_, ready)) {
    failCuda(op, e, "making the NCCL stream wait for the op's inputs");
  }
}

void NcclBackend::finish(const Op& op, const char* what, const CheckedCounts& counts) {
  if (int e = plugin_->eventRecord(event_, stream_)) {
    failCuda(op, e, "recording an event after the NCCL op");
  }
  runCheck(op, counts);
  await(op, event_, what);
}

void NcclBackend::runCheck(const Op& op, const CheckedCounts& counts) {
  if (!check_) return;
  try {
    check_->run(op, counts);
  } catch (...) {
    abortComms();  // the op may wait for a peer that runs another one
    throw;
  }
}

void NcclBackend::await(const Op& op, void* event, const char* what) {
  const Clock::time_point start = Clock::now();
  Clock::time_point poll = start;
  // Until the caller's work that produces the inputs has run, the op has
  // not started: from then on it has a full GFLOW_TIMEOUT.
  void* ready = readyEvent(op);
  bool inputsReady = ready == nullptr;
  Deadline deadline = op.deadline;
  for (;;) {
    if (!inputsReady) {
      const int r = plugin_->eventQuery(ready);
      if (r != 0 && r != cuda::kNotReady) failCuda(op, r, "waiting for the op's inputs");
      if (r == 0) {
        inputsReady = true;
        const Deadline fresh = Deadline::after(s_.timeout);
        if (fresh.at() > deadline.at()) deadline = fresh;
      }
    }
    const char* waited =
        inputsReady ? what : "the caller's work producing the op's inputs (on its stream)";
    if (passed(op, event, deadline, waited, &poll)) return;
    backoff(start);
  }
}

bool NcclBackend::passed(const Op& op, void* event, const Deadline& deadline, const char* what,
                         Clock::time_point* poll) {
  const int q = plugin_->eventQuery(event);
  if (q != 0 && q != cuda::kNotReady) failCuda(op, q, "waiting for the NCCL op on the GPU");
  // Also once the GPU is done: kernels that a peer's abort released end
  // without their result, which only the asynchronous error tells.
  int a = nccl::kSuccess;
  if (int r = api_->commGetAsyncError(comm_, &a)) {
    failNccl(op, r, "ncclCommGetAsyncError", comm_);
  }
  if (a != nccl::kSuccess && a != nccl::kInProgress) failNccl(op, a, what, comm_);
  if (q == 0) return true;
  checkWaiting(op, deadline, what, poll);
  return false;
}

void NcclBackend::checkWaiting(const Op& op, const Deadline& deadline, const char* what,
                               Clock::time_point* poll) {
  if (abortError_.failed()) {
    abortComms();
    abortError_.throwIfFailed();
  }
  if (deadline.expired()) {
    abortComms();
    GFLOW_THROW(kTimeout, ErrorContext().withSeq(op.seq).withRank(s_.rank))
        << what << " did not complete within the deadline (GFLOW_TIMEOUT, " << s_.timeout.count()
        << " ms): a rank did not call it, called another op, is stuck or died"
        << (api_ ? "; the NCCL communicator was stopped (aborted, or revoked for a shrink)" : "");
  }
  const Clock::time_point now = Clock::now();
  if (now - *poll < kReportPoll) return;
  *poll = now;
  // A peer that failed wrote a report (notifyPeers); the store may itself be
  // gone with rank 0, which only leaves the deadline.
  int64_t failures = 0;
  try {
    failures = s_.store->add(s_.prefix + "nccl/failed", 0);
  } catch (const Error&) {
    return;
  }
  if (failures <= 0) return;
  // Its text may lag the count a little.
  raiseReport(op, std::chrono::milliseconds(1000), true);
}

void NcclBackend::raiseReport(const Op& op, std::chrono::milliseconds wait, bool announced) {
  std::vector<uint8_t> report;
  try {
    report = s_.store->get(s_.prefix + "nccl/failure", wait);
  } catch (const Error&) {
    if (!announced) return;
    const std::vector<char> unknown = transport::errorReportPayload(
        Error(ErrorCode::kPeerLost, "another rank failed (its report could not be read)"), 256);
    report.assign({'-', '1', ' '});
    report.insert(report.end(), unknown.begin(), unknown.end());
  }
  abortComms();
  // "<rank> <report>": the reporting rank, then its errorReportPayload.
  const std::string r(report.begin(), report.end());
  const size_t space = r.find(' ');
  long peer = -1;
  if (space != std::string::npos) {
    char* end = nullptr;
    peer = std::strtol(r.c_str(), &end, 10);
    if (end != r.c_str() + space || peer < 0 || peer >= s_.size) peer = -1;
  }
  const std::string payload = space == std::string::npos ? r : r.substr(space + 1);
  throw transport::peerReport(s_.rank, op.seq, static_cast<int>(peer), payload.data(),
                              payload.size());
}

Error NcclBackend::ncclError(const Op& op, int result, const char* what, void* comm) const {
  std::string detail = std::string(what) + " failed: " + api_->getErrorString(result);
  const char* last = api_->getLastError(comm);
  if (last && *last) detail += std::string(" (") + last + ")";
  return Error(codeOf(result), detail, ErrorContext().withSeq(op.seq).withRank(s_.rank));
}

void NcclBackend::failNccl(const Op& op, int result, const char* what, void* comm) {
  const Error e = ncclError(op, result, what, comm);
  abortComms();
  // A peer's failure ends this rank's NCCL op as a remote error that names
  // nobody: where that peer reported its own error (notifyPeers, which
  // follows its abort closely), that report is the op's error.
  if (codeOf(result) == ErrorCode::kPeerLost) raiseReport(op, kReportGrace, false);
  throw e;
}

void NcclBackend::failCuda(const Op& op, int err, const char* what) {
  abortComms();
  GFLOW_THROW(kInternal, ErrorContext().withSeq(op.seq).withRank(s_.rank))
      << "CUDA failed while " << what << ": " << plugin_->errorString(err);
}

void NcclBackend::abortComms() {
  failed_ = true;
  // Only a communicator that ran ops (not one still starting) is kept.
  const bool keep =
      !part_ && state_ == State::kNccl && api_ && api_->commRevoke && api_->commShrink;
  state_ = State::kBroken;
  if (!api_) return;
  const int revoked = comm_ && keep ? api_->commRevoke(comm_) : nccl::kInvalidUsage;
  if (revoked == nccl::kSuccess || revoked == nccl::kInProgress) {  // non-blocking: in progress
    revoked_ = comm_;
  } else if (comm_) {
    api_->commAbort(comm_);
  }
  comm_ = nullptr;
  for (NcclBackend* p : {intra_, cross_}) {
    if (p) p->abortComms();
  }
}

void NcclBackend::dropRevoked() {
  if (revoked_) api_->commAbort(revoked_);
  revoked_ = nullptr;
}

void NcclBackend::abort(const Error& error) {
  abortError_.set(error);
  if (Backend* h = hierarchical_.load(std::memory_order_acquire)) h->abort(error);
}

bool NcclBackend::reject(uint64_t, const std::string&) {
  return state_ == State::kUndecided || state_ == State::kStaged;
}

void NcclBackend::notifyPeers(const Error& error) {
  // Only peers that wait inside NCCL or its start read the store report.
  if (state_ == State::kUndecided || state_ == State::kStaged) return;
  failed_ = true;
  std::string report = std::to_string(s_.rank) + " ";
  const std::vector<char> payload = transport::errorReportPayload(error, 2048);
  report.append(payload.begin(), payload.end());
  try {
    // The first report wins; readers wait briefly for its text.
    if (s_.store->add(s_.prefix + "nccl/reporters", 1) == 1) {
      s_.store->set(s_.prefix + "nccl/failure", std::vector<uint8_t>(report.begin(), report.end()));
      s_.store->add(s_.prefix + "nccl/failed", 1);
    }
  } catch (const Error& e) {
    GFLOW_LOG(DEBUG) << "rank " << s_.rank << ": could not report the failure to NCCL peers "
                     << "through the store: " << e.what();
  }
}

// ---- collectives -----------------------------------------------------------

namespace {

// The op's operands as NCCL takes them: its elements, or (allgather,
// broadcast: a copy, whatever the type) its bytes.
nccl::Collective operands(const Op& op, const void* in, void* out) {
  return nccl::Collective{in,
                          out,
                          op.desc.count,
                          static_cast<int>(op.desc.dtype),
                          static_cast<int>(op.desc.op),
                          op.desc.root};
}

nccl::Collective bytes(const Op& op, const void* in, void* out) {
  return nccl::Collective{in, out,         byteCount(op.desc), static_cast<int>(DataType::kUInt8),
                          0,  op.desc.root};
}

}  // namespace

void NcclBackend::allreduce(const Op& op, const void* in, void* out) {
  cuda::DeviceGuard g(*plugin_, device_);
  begin(op);
  check(op, comm_, "ncclAllReduce", api_->allReduce(operands(op, in, out), comm_, stream_));
  finish(op, "ncclAllReduce");
}

void NcclBackend::reduceScatter(const Op& op, const void* in, void* out) {
  cuda::DeviceGuard g(*plugin_, device_);
  begin(op);
  check(op, comm_, "ncclReduceScatter", api_->reduceScatter(operands(op, in, out), comm_, stream_));
  finish(op, "ncclReduceScatter");
}

void NcclBackend::allgather(const Op& op, const void* in, void* out) {
  cuda::DeviceGuard g(*plugin_, device_);
  begin(op);
  check(op, comm_, "ncclAllGather", api_->allGather(bytes(op, in, out), comm_, stream_));
  finish(op, "ncclAllGather");
}

void NcclBackend::broadcast(const Op& op, void* buf) {
  cuda::DeviceGuard g(*plugin_, device_);
  begin(op);
  check(op, comm_, "ncclBroadcast", api_->broadcast(bytes(op, buf, buf), comm_, stream_));
  finish(op, "ncclBroadcast");
}

void NcclBackend::reduce(const Op& op, const void* in, void* out) {
  cuda::DeviceGuard g(*plugin_, device_);
  const size_t bytes = op.desc.count * dataTypeSize(op.desc.dtype);
  DeviceCopy copy;
  void* dst = s_.rank == op.desc.root ? rootBuffer(op, out, bytes, false, &copy) : out;
  begin(op);
  check(op, comm_, "ncclReduce", api_->reduce(operands(op, in, dst), comm_, stream_));
  finish(op, "ncclReduce");
  copyBack(op, out, bytes, copy);
}

void NcclBackend::barrier(const Op& op) {
  cuda::DeviceGuard g(*plugin_, device_);
  if (!barrierWord_) {
    if (int e = plugin_->deviceAlloc(&barrierWord_, sizeof(int32_t))) {
      failCuda(op, e, "allocating the barrier's device word");
    }
  }
  begin(op);
  check(op, comm_, "ncclAllReduce (barrier)",
        api_->allReduce(
            nccl::Collective{barrierWord_, barrierWord_, 1, static_cast<int>(DataType::kInt32),
                             static_cast<int>(ReduceOp::kSum), 0},
            comm_, stream_));
  finish(op, "ncclAllReduce (barrier)");
}

}  // namespace gflow::backend
