// CommunicatorImpl: the communicator behind the public Communicator (which
// it derives from). It checks arguments, stamps each op with its sequence
// number, runs it through the executor on the router (the one Backend it
// calls, which routes it), and hands failures to its Verdict
// (core/verdict.h: the sticky error, settling, rejections). Its creation,
// the agreement on hosts and settings and split() are in
// communicator_create.cc; the ops and the front door's counters in
// communicator.cc. The front door (Communicator's own members) and the
// gradient layer (internal::CommunicatorAccess) reach it through the
// public members only.
#pragma once

#include <array>
#include <atomic>
#include <memory>
#include <mutex>
#include <optional>
#include <string>
#include <vector>

#include "backend/backend.h"
#include "backend/device_buffers.h"
#include "backend/route_policy.h"
#include "backend/router.h"
#include "bootstrap/attendance.h"
#include "bootstrap/environment.h"
#include "common/thread_annotations.h"
#include "core/executor.h"
#include "core/settings.h"
#include "core/verdict.h"
#include "gflow/communicator.h"
#include "kernels/device_kernels_pool.h"
#include "transport/transport.h"

namespace gflow {

class CommunicatorImpl final : public Communicator {
 public:
  CommunicatorImpl() = default;
  ~CommunicatorImpl() override;

  int commRank() const { return rank; }
  int commSize() const { return size; }
  // Where this rank sits among the hosts (the host grouping at creation).
  struct HostLayout {
    int localRank = 0;
    int localSize = 1;
    int hostIndex = 0;
    int numHosts = 1;
  };
  const HostLayout& hostLayout() const { return layout; }
  // Communicator::stats(): the counters of the ops, the paths, the peers.
  Stats collectStats() const;
  // Who reached each collective last (common/arrivals.h). Thread-safe.
  Arrivals& arrivalLog() const { return *arrivals; }
  // Reproducible mode (allreduce, reduce-scatter); the gradient layer sets
  // its own communicator's before its first op.
  bool reproducibleMode() const { return settings.reproducible; }
  void setReproducibleMode(bool on) { settings.reproducible = on; }
  // Settings::codecPieceBytes: where a compressed host allreduce is cut.
  uint64_t codecPieceBytes() const { return settings.codecPieceBytes; }
  // Communicator::abort() with `e` (any thread): pending and later ops fail
  // with it, and so do the peers'.
  void abortWith(const Error& e) { verdict.failAnywhere(e); }
  // Communicator::split.
  std::shared_ptr<Communicator> splitOff(int color, int key);
  // Communicator::shrink (core/shrink.cc).
  std::shared_ptr<Communicator> shrinkTo(const std::vector<int>& exclude);
  // One attempt of shrinkTo: attendance, then the connection of those
  // present, then whether it stands (decided once for all).
  struct Attempt {
    std::shared_ptr<Communicator> comm;  // it stands, and this rank is in it
    bool countedOut = false;             // it stands without this rank
    std::vector<int> members;            // who was present (this numbering)
    std::shared_ptr<const Error> error;  // why it does not stand
    int lost = -1;                       // the member the connection blamed
  };
  Attempt shrinkAttempt(const bootstrap::Meeting& meeting);
  // Communicator::grow (core/grow.cc), and its rank 0's part: the numbers
  // of the joiners it admits, their admissions written under `prefix`.
  std::shared_ptr<Communicator> growBy();
  std::vector<int64_t> admitJoiners(const std::string& prefix);
  // The one Backend this communicator calls (executing thread).
  backend::Router& router() { return *backend; }
  // The kernels of memory on `where` with work on `stream` (host kernels,
  // or this communicator's CudaKernels of that GPU and stream; see
  // kernelsPool). Thread-safe.
  std::shared_ptr<kernels::GradientKernels> kernelsFor(Device where, void* stream) {
    return kernelsPool.get(where, stream);
  }

  // Whether an allreduce or reduce-scatter of `dtype` asks for reproducible
  // mode (OpDesc::reproducible): `asked`, else the communicator's setting.
  // Integer and bool reductions give the same bits in any order, so only
  // the floating-point and complex types need the fixed order.
  bool reproducible(DataType dtype, std::optional<bool> asked = std::nullopt) const {
    const bool exact = dtype != DataType::kFloat32 && dtype != DataType::kFloat16 &&
                       dtype != DataType::kBFloat16 && dtype != DataType::kFloat64 &&
                       dtype != DataType::kFloat8E4M3 && dtype != DataType::kFloat8E5M2 &&
                       dtype != DataType::kComplex64 && dtype != DataType::kComplex128 &&
                       !isQuantized(dtype);
    return asked.value_or(settings.reproducible) && !exact;
  }

  // Runs one collective (blocking or async) with the common bookkeeping.
  // `buffers`: Op::buffers of every run (backend::DeviceBuffers::bind);
  // `opName`: the op's name in errors (default: desc.kind's); `overlap`:
  // what the op runs on the executor's host lane (Executor::submit).
  std::shared_ptr<WorkState> submit(backend::OpDesc desc, bool blocking,
                                    std::function<void(const backend::Op&)> body,
                                    std::shared_ptr<backend::DeviceBuffers> buffers = nullptr,
                                    const char* opName = nullptr,
                                    std::shared_ptr<const Overlap> overlap = nullptr);
  // Executing thread, inside submit's body: the op's last step, on the host
  // lane when the op was submitted with an Overlap (Executor::finishOnLane).
  void finishOnLane(std::function<void()> after) { executor.finishOnLane(std::move(after)); }
  // Executing thread, inside submit's body: the running op stays in flight
  // after the body returns; progressInFlight() completes its Work (after
  // `done`) or fails it and the communicator.
  void defer(std::unique_ptr<backend::P2PInFlight> op, std::function<void()> done,
             const char* name);
  // Raises kInvalidArgument for `op`. A collective is rejected (reject):
  // the communicator stays usable. A point-to-point call
  // (isPointToPointCall) fails the communicator, as its peer's matching op
  // has no number to reject, and so does any call under FatalArgumentErrors.
  [[noreturn]] void invalid(const char* op, const std::string& what);
  // Raises kInvalidArgument for `op` and fails the communicator with it.
  [[noreturn]] void failInvalid(const char* op, const std::string& what);
  // While one is alive on a thread, invalid() there fails the communicator
  // instead of rejecting: the gradient layer's bucket ops (a reducer cannot
  // be left with some buckets reduced and one rejected).
  struct FatalArgumentErrors {
    FatalArgumentErrors();
    ~FatalArgumentErrors();
    FatalArgumentErrors(const FatalArgumentErrors&) = delete;
    FatalArgumentErrors& operator=(const FatalArgumentErrors&) = delete;
  };
  // The collective `e` names will not run here: its op number goes to it
  // (on the executing thread, after the earlier ops), and the backends tell
  // the peers (Backend::reject), so a peer that runs that op fails with
  // kMismatch and one that rejected it too goes on. Where a backend cannot
  // (NCCL), the communicator fails with `e` instead.
  void reject(const Error& e);
  std::shared_ptr<const Error> error();
  void checkUsable(const char* op);
  void validateTensor(const char* op, const char* name, const Tensor& t);
  // What DeviceBuffers::bind needs for an op of this communicator.
  backend::DeviceBuffers::Binding binding(const char* op) const { return {op, rank, events}; }
  // `rop` is a valid op that applies to `dtype` (a dtype outside the enum is
  // validateTensor's to report).
  void validateOp(const char* op, ReduceOp rop, DataType dtype);

  // What a new communicator is made of (connect).
  struct ConnectPlan {
    transport::ContextOptions context;  // rank, size, store, prefix, ...
    std::string transportName;
    Settings settings;  // the configuration in force (core/settings.h)
    uint64_t hostHash = 0;
    // The launcher's local rank and size (-1: not known, as in a split).
    int launcherLocalRank = -1;
    int launcherLocalSize = -1;
  };
  // The plan of a new communicator from the caller's options: rank id.rank
  // of id.size under `prefix` on `store` (create, join).
  static ConnectPlan planFor(const Options& options, const Settings& settings,
                             const bootstrap::Identity& id, std::shared_ptr<Store> store,
                             std::string prefix);
  // Builds the backends for (store, prefix): the flat host backend over the
  // network transport, then, from the host grouping, the shared-memory
  // backend (one host) or the hierarchical one (several hosts).
  // plan.context.progress is taken from plan.settings.
  static std::unique_ptr<CommunicatorImpl> connect(ConnectPlan plan);

 private:
  int rank = 0;
  int size = 1;
  HostLayout layout;
  std::chrono::milliseconds timeout{300000};
  std::vector<uint64_t> hostOf;  // host hash per rank
  std::string transportName;
  transport::ContextOptions contextOptions;  // template for split()
  std::unique_ptr<backend::Router> backend;
  // The device kernels of AllreduceOptions and allreduceCoalesced
  // (CommunicatorAccess::kernelsFor): destroyed after the executor's last
  // op, so no op's device memory is freed while ops run.
  kernels::DeviceKernelsPool kernelsPool;
  // The events the ops' DeviceBuffers mark their device inputs with.
  std::shared_ptr<backend::EventPool> events = std::make_shared<backend::EventPool>();
  Executor executor;  // runs the ops in order
  // The role of the thread that runs the ops (the executor's, or a blocking
  // caller's inline): what only it touches is GUARDED_BY(executing).
  ThreadRole executing;

  uint64_t seq GFLOW_GUARDED_BY(executing) = 0;
  std::atomic<uint64_t> splitCount{0};
  std::atomic<uint64_t> shrinkCount{0};
  std::atomic<uint64_t> growCount{0};
  Settings settings;  // inherited by split()

  // Point-to-point ops in flight after their task (defer); executing thread.
  struct InFlight {
    std::unique_ptr<backend::P2PInFlight> op;
    std::function<void()> done;
    std::shared_ptr<WorkState> work;
    const char* name;
  };
  std::vector<InFlight> inFlight GFLOW_GUARDED_BY(executing);
  // The executor's background: drives the ops in flight once; true while
  // any remains.
  bool progressInFlight() noexcept GFLOW_REQUIRES(executing);
  // Fails the ops in flight with `e` once no thread executes (destruction).
  void dropInFlight(const Error& e) GFLOW_REQUIRES(executing);

  Verdict verdict;  // how this communicator fails (core/verdict.h)

  std::array<std::atomic<uint64_t>, backend::kNumOpKinds> opCount{};  // Stats

  // Who reached each collective last (common/arrivals.h), shared with the
  // backends' transports and groups; GFLOW_STRAGGLER_REPORT's timing.
  std::shared_ptr<Arrivals> arrivals;
  int64_t reportEvery = 0;  // Arrivals::now() ticks
  int64_t lastReport GFLOW_GUARDED_BY(executing) = 0;
  bool summaryAtExit = false;
  // Executing thread, after each collective: rank 0's periodic summary.
  void reportStragglers() GFLOW_REQUIRES(executing);

  // Communicator::split's part that the parent's backend derives
  // (Backend::splitInto), on the executing thread after every earlier op.
  void splitBackend(int color, int key, CommunicatorImpl* child);
  // Communicator::shrink's part that this (the old) communicator's backend
  // derives for `child` (Backend::shrinkInto) where every one of `members`
  // (sorted, this numbering) can, decided under the `attempt` prefix.
  // `voted`: set once this rank has answered the attempt's question.
  void shrinkBackend(const std::string& attempt, const std::vector<int>& members,
                     CommunicatorImpl& child, bool* voted);
  // This rank's no to the attempt's question (its connection failed).
  void voteNo(const std::string& attempt);
  static std::string deviceQuestion(const std::string& attempt);  // its keys' prefix

  // Connects the shm or hierarchical backends once hostOf is known.
  void buildHierarchy(const transport::ContextOptions& ctxOpts, int launcherLocalRank,
                      int launcherLocalSize);
  // The creation-time agreement: every rank learns every rank's host (into
  // hostOf) and checks that the kAgree settings in force match rank 0's.
  void agreeOnHostsAndSettings(uint64_t hostHash);
};

// Without a job token anyone who reaches the store or a data port can join
// or disrupt the job: kInvalidArgument under GFLOW_REQUIRE_TOKEN=1, else one
// warning (rank 0, once per process). `tokenComing`: the PMIx rendezvous
// will share one. Communicator::create and join.
void checkAuthenticated(const bootstrap::Identity& id, bool tokenComing);
// Options::timeout, else GFLOW_TIMEOUT.
std::chrono::milliseconds timeoutOf(const Options& options);

inline size_t opIndex(backend::OpKind k) {
  return static_cast<size_t>(k);
}

// The implementation behind a Communicator (every Communicator is one).
inline CommunicatorImpl& impl(Communicator& c) {
  return static_cast<CommunicatorImpl&>(c);
}
inline CommunicatorImpl& impl(const Communicator& c) {
  return const_cast<CommunicatorImpl&>(static_cast<const CommunicatorImpl&>(c));
}

}  // namespace gflow
