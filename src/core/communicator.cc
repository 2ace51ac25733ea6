#include <algorithm>
#include <cmath>
#include <cstdio>
#include <mutex>
#include <tuple>

#include "backend/device_buffers.h"
#include "backend/hierarchical/hierarchical.h"
#include "bootstrap/environment.h"
#include "bootstrap/rendezvous.h"
#include "common/check.h"
#include "common/hash.h"
#include "common/logging.h"
#include "common/params.h"
#include "common/resource_counts.h"
#include "common/socket.h"
#include "common/tick_clock.h"
#include "core/communicator_impl.h"
#include "core/frontend.h"
#include "core/host_backends.h"
#include "core/internal.h"
#include "core/op_checks.h"
#include "gflow/communicator.h"
#include "topology/data_interface.h"

namespace gflow {

using backend::Algorithm;
using backend::OpDesc;
using backend::OpKind;

// ---- CommunicatorImpl ------------------------------------------------------

namespace {

// The op `e` concerns: an earlier op a peer's report said it failed in (a
// rank that completed op n fails in n+1 when a peer still in n reports),
// else this rank's op `mine`.
uint64_t reportedOp(const Error& e, uint64_t mine) {
  const uint64_t theirs = e.context().reportedSeq;
  return theirs >= 1 && theirs < mine ? theirs : mine;
}

}  // namespace

std::shared_ptr<const Error> CommunicatorImpl::error() {
  return verdict.error();
}

void CommunicatorImpl::checkUsable(const char* op) {
  if (auto e = error()) {
    // The original error, so every later call names the root cause.
    (void)op;
    throw *e;
  }
}

namespace {
thread_local int tlsFatalArgumentErrors = 0;  // FatalArgumentErrors alive on this thread
}  // namespace

CommunicatorImpl::FatalArgumentErrors::FatalArgumentErrors() {
  ++tlsFatalArgumentErrors;
}
CommunicatorImpl::FatalArgumentErrors::~FatalArgumentErrors() {
  --tlsFatalArgumentErrors;
}

void CommunicatorImpl::invalid(const char* op, const std::string& what) {
  if (tlsFatalArgumentErrors > 0 || opcheck::isPointToPointCall(op)) failInvalid(op, what);
  Error e(ErrorCode::kInvalidArgument, what, ErrorContext::forOp(op).withRank(rank));
  reject(e);
  throw e;
}

void CommunicatorImpl::failInvalid(const char* op, const std::string& what) {
  Error e(ErrorCode::kInvalidArgument, what, ErrorContext::forOp(op).withRank(rank));
  // A peer may be waiting on this rank: failing the communicator and
  // telling it turns its wait into an immediate error.
  verdict.failAnywhere(e);
  throw e;
}

void CommunicatorImpl::reject(const Error& e) {
  if (!backend || error()) return;
  auto task = [this, e] {
    executing.enter();         // a task of the executor
    verdict.reject(e, ++seq);  // the number this call would have run as
  };
  // Runs here when no op is queued or running, so the peers have heard
  // before the call raises (even if the communicator is destroyed next);
  // else after the earlier ops, without waiting for them.
  executor.runOrQueue(std::move(task));
}

void CommunicatorImpl::validateTensor(const char* op, const char* name, const Tensor& t) {
  if (static_cast<int>(t.dtype) >= kNumDataTypes) {
    invalid(op, std::string(name) + " has an invalid dtype (" +
                    std::to_string(static_cast<int>(t.dtype)) + ")");
  }
  const std::string where = backend::checkPlacement(t);
  if (!where.empty()) invalid(op, name + where);
  if (t.count > 0 && t.data == nullptr) {
    invalid(op, std::string(name) + ".data is null but count is " + std::to_string(t.count));
  }
  if (t.count > (uint64_t(1) << 46) / dataTypeSize(t.dtype)) {
    invalid(op, std::string(name) + ".count " + std::to_string(t.count) + " is too large");
  }
}

void CommunicatorImpl::validateOp(const char* op, ReduceOp rop, DataType dtype) {
  if (static_cast<int>(rop) >= kNumReduceOps) {
    invalid(op, "invalid reduce op (" + std::to_string(static_cast<int>(rop)) + ")");
  }
  if (static_cast<int>(dtype) >= kNumDataTypes || supportsReduceOp(dtype, rop)) return;
  const char* which = dtype == DataType::kBool ? "bool takes every op but avg"
                      : dtype == DataType::kComplex64 || dtype == DataType::kComplex128
                          ? "complex types take sum and avg"
                      : isQuantized(dtype) ? "quantized types take sum, avg, min and max"
                                           : "bitwise ops take integer types and bool";
  invalid(op, std::string("reduce op ") + toString(rop) + " does not apply to " + toString(dtype) +
                  " data (" + which + ")");
}

std::shared_ptr<WorkState> CommunicatorImpl::submit(OpDesc desc, bool blocking,
                                                    std::function<void(const backend::Op&)> body,
                                                    std::shared_ptr<backend::DeviceBuffers> buffers,
                                                    const char* opName,
                                                    std::shared_ptr<const Overlap> overlap) {
  const char* name = opName ? opName : backend::toString(desc.kind);
  checkUsable(name);
  opCount[opIndex(desc.kind)].fetch_add(1, std::memory_order_relaxed);
  auto task = [this, desc, name, body = std::move(body), buffers = std::move(buffers)] {
    executing.enter();  // the executor runs its tasks on the executing thread
    // Point-to-point stands outside the collectives' order (only two ranks
    // take part): it carries the last collective's number, for errors.
    const uint64_t mySeq = desc.kind == OpKind::kPointToPoint ? seq : ++seq;
    // Failed by abort() or bad input on another thread: tell the peers now
    // (this is the executing thread) and raise the original error.
    if (auto e = error()) {
      verdict.notifyOnce(e);
      throw *e;
    }
    const backend::Op op{mySeq, desc, Deadline::after(timeout), buffers};
    // Point-to-point ops are not the collectives' arrivals.
    struct Arrival {
      Arrivals* a;
      ~Arrival() {
        if (a) a->abandon();  // the op failed (a no-op once ended)
      }
    } arrival{desc.kind == OpKind::kPointToPoint ? nullptr : arrivals.get()};
    if (arrival.a) arrival.a->begin();
    try {
      body(op);
    } catch (const Error& e) {
      Error full = relabel(e, ErrorContext::forOp(name)
                                  .withSeq(reportedOp(e, mySeq))
                                  .withRank(rank)
                                  .withPeer(blamed(e, size)));
      if (desc.kind == OpKind::kPointToPoint) {
        verdict.fail(full);
        throw full;
      }
      throw verdict.settle(full);
    } catch (const std::exception& e) {
      // E.g. bad_alloc: receives may already be posted into user memory, so
      // the communicator must not be used again.
      Error full(ErrorCode::kInternal, std::string("unexpected exception: ") + e.what(),
                 ErrorContext::forOp(name).withSeq(mySeq).withRank(rank));
      verdict.fail(full);
      throw full;
    }
    if (arrival.a) {
      arrival.a->end();
      reportStragglers();
    }
    // abort() may have arrived after the op's last transport call.
    if (auto e = error()) verdict.notifyOnce(e);
  };
  return executor.submit(std::move(task), blocking, std::move(overlap));
}

void CommunicatorImpl::defer(std::unique_ptr<backend::P2PInFlight> op, std::function<void()> done,
                             const char* name) {
  executing.enter();  // called by a submitted body, on the executing thread
  inFlight.push_back(InFlight{std::move(op), std::move(done), executor.deferCurrent(), name});
}

bool CommunicatorImpl::progressInFlight() noexcept {
  for (size_t i = 0; i < inFlight.size();) {
    InFlight& f = inFlight[i];
    std::shared_ptr<const Error> failed;
    try {
      if (!f.op->test()) {
        ++i;
        continue;
      }
      f.done();
    } catch (const Error& e) {
      failed = std::make_shared<const Error>(relabel(
          e, ErrorContext::forOp(f.name).withSeq(seq).withRank(rank).withPeer(blamed(e, size))));
    } catch (const std::exception& e) {
      failed = std::make_shared<const Error>(
          ErrorCode::kInternal, std::string("unexpected exception: ") + e.what(),
          ErrorContext::forOp(f.name).withSeq(seq).withRank(rank));
    }
    if (failed) verdict.fail(*failed);
    f.work->finish(failed);
    inFlight.erase(inFlight.begin() + static_cast<std::ptrdiff_t>(i));
  }
  return !inFlight.empty();
}

void CommunicatorImpl::dropInFlight(const Error& e) {
  for (InFlight& f : inFlight) f.work->finish(std::make_shared<const Error>(e));
  inFlight.clear();
}

// ---- Communicator ----------------------------------------------------------

Communicator::~Communicator() = default;

void CommunicatorImpl::reportStragglers() {
  if (rank != 0 || reportEvery <= 0) return;
  const int64_t now = Arrivals::now();
  if (now - lastReport < reportEvery) return;
  const std::string s = arrivals->summary(true);
  if (!s.empty()) {
    std::fprintf(stderr, "gflow straggler report (%d ranks, last %.1f s): %s\n", size,
                 static_cast<double>(TickClock::toNs(now - lastReport)) / 1e9, s.c_str());
  }
  lastReport = now;
}

CommunicatorImpl::~CommunicatorImpl() {
  if (summaryAtExit && rank == 0 && arrivals) {
    try {
      const std::string s = arrivals->summary(false);
      if (!s.empty()) {
        std::fprintf(stderr, "gflow straggler summary (%d ranks): %s\n", size, s.c_str());
      }
    } catch (const std::exception&) {
      // Out of memory at teardown: no summary.
    }
  }
  if (!backend) return;
  Error e(ErrorCode::kAborted, "the communicator was destroyed", ErrorContext().withRank(rank));
  // Wake a running op (if any) and drop queued ones before joining the
  // worker; the transport is going away anyway.
  backend->abort(e);
  executor.shutdown(e);
  executing.enter();  // no thread executes any more
  dropInFlight(e);
}

int Communicator::rank() const {
  return impl(*this).commRank();
}
int Communicator::size() const {
  return impl(*this).commSize();
}
int Communicator::localRank() const {
  return impl(*this).hostLayout().localRank;
}
int Communicator::localSize() const {
  return impl(*this).hostLayout().localSize;
}
int Communicator::hostIndex() const {
  return impl(*this).hostLayout().hostIndex;
}
int Communicator::numHosts() const {
  return impl(*this).hostLayout().numHosts;
}

void internal::CommunicatorAccess::failInvalid(Communicator& comm, const char* op,
                                               const std::string& what) {
  impl(comm).failInvalid(op, what);
}

void frontend::rejectInvalidArgument(Communicator& comm, const std::string& op,
                                     const std::string& what) {
  // The op name outlives the throw: Error copies it.
  impl(comm).invalid(op.c_str(), what);
}

void Communicator::abort() {
  CommunicatorImpl& I = impl(*this);
  I.abortWith(Error(ErrorCode::kAborted,
                    "abort() was called on rank " + std::to_string(I.commRank()),
                    ErrorContext::forOp("abort").withRank(I.commRank())));
}

void internal::CommunicatorAccess::abortWith(Communicator& comm, const Error& e) {
  impl(comm).abortWith(e);
}

MemoryRegistration::~MemoryRegistration() = default;

namespace {
class Registration final : public MemoryRegistration {
 public:
  Registration(void* d, size_t n) : MemoryRegistration(d, n) {}
  std::vector<std::unique_ptr<transport::MemoryRegion>> regions;
};
}  // namespace

std::unique_ptr<MemoryRegistration> Communicator::registerMemory(void* data, size_t bytes) {
  if (!data && bytes > 0) {
    GFLOW_THROW(kInvalidArgument,
                ErrorContext::forOp("register_memory").withRank(impl(*this).commRank()))
        << "registerMemory of " << bytes << " bytes at a null pointer";
  }
  auto r = std::make_unique<Registration>(data, bytes);
  if (bytes > 0) impl(*this).router().registerMemory(data, bytes, &r->regions);
  return r;
}

Stats Communicator::stats() const {
  return impl(*this).collectStats();
}

namespace {

// This rank's connections (from its peers' counters) and the process's
// counts (common/resource_counts.h).
Stats::Resources resourcesOf(const std::vector<PeerStats>& peers) {
  Stats::Resources r;
  for (const PeerStats& p : peers) {
    r.peersConnected += p.connections > 0 ? 1 : 0;
    r.connections += p.connections;
  }
  const resources::Counts c = resources::now();
  r.storeRequests = c.storeRequests;
  r.storeServed = c.storeServed;
  r.threadsStarted = c.threadsStarted;
  r.pinnedBytes = c.pinnedBytes;
  r.sharedBytes = c.sharedBytes;
  return r;
}

}  // namespace

Stats CommunicatorImpl::collectStats() const {
  Stats s;
  s.peers.resize(size);
  for (int p = 0; p < size; ++p) {
    if (p != rank) s.peers[p] = backend->peerStats(p);
    const std::vector<uint64_t>& host = hostOf;
    s.peers[p].sameHost = host.size() > static_cast<size_t>(p) &&
                          host[static_cast<size_t>(p)] == host[static_cast<size_t>(rank)];
  }
  s.allreduce = opCount[opIndex(OpKind::kAllreduce)];
  s.reduceScatter = opCount[opIndex(OpKind::kReduceScatter)];
  s.broadcast = opCount[opIndex(OpKind::kBroadcast)];
  s.barrier = opCount[opIndex(OpKind::kBarrier)];
  s.reduce = opCount[opIndex(OpKind::kReduce)];
  auto count = [&](OpKind a, OpKind b) { return opCount[opIndex(a)] + opCount[opIndex(b)]; };
  s.allgather = count(OpKind::kAllgather, OpKind::kAllgatherv);
  s.gather = count(OpKind::kGather, OpKind::kGatherv);
  s.scatter = count(OpKind::kScatter, OpKind::kScatterv);
  s.alltoall = count(OpKind::kAlltoall, OpKind::kAlltoallv);
  s.pointToPoint = opCount[opIndex(OpKind::kPointToPoint)];
  const backend::PathCounts paths = backend->paths();
  s.sharedMemoryOps = paths.of(backend::Path::kShm);
  s.hierarchicalOps = paths.of(backend::Path::kHierarchical);
  s.networkOps = paths.of(backend::Path::kNetwork);
  s.ncclOps = paths.of(backend::Path::kNccl) + paths.of(backend::Path::kNcclHierarchical);
  s.stagedOps = paths.staged;
  for (const backend::RouteCount& r : backend->routes()) {
    s.routes.push_back({backend::toString(r.kind), backend::toString(r.route.path),
                        backend::toString(r.route.algo), r.ops});
  }
  const Arrivals::Totals t = arrivals->totals();
  for (size_t p = 0; p < t.timesLast.size(); ++p) {
    s.peers[p].timesLast = t.timesLast[p];
    s.peers[p].lateNs = t.lateNs[p];
  }
  s.arrivalOps = t.ops;
  s.resources = resourcesOf(s.peers);
  return s;
}

std::string Communicator::stragglerSummary() const {
  return impl(*this).arrivalLog().summary(false);
}

std::shared_ptr<const Error> Communicator::error() const {
  return impl(*this).error();
}

uint64_t Stats::bytesSent() const {
  uint64_t t = 0;
  for (const auto& p : peers) t += p.bytesSent;
  return t;
}

uint64_t Stats::networkBytesSent() const {
  uint64_t t = 0;
  for (const auto& p : peers) t += p.sameHost ? 0 : p.bytesSent;
  return t;
}

uint64_t Stats::bytesReceived() const {
  uint64_t t = 0;
  for (const auto& p : peers) t += p.bytesReceived;
  return t;
}

}  // namespace gflow
