// GradientReducer: lazy allreduce with chunk fusion (include/gflow/reducer.h).
//
// Gradients that are packed live, between pack and unpack, in one persistent
// pool per dtype laid out in registration order (slots only for tensors that
// may be packed); a bucket (fixed or negotiated) packs its tensors
// contiguously from its first tensor's slot. A bucket's region may run over
// the slots of tensors of other buckets (its tensors need not be adjacent in
// the list), which is safe because buckets run one at a time on the
// progress thread and each touches its region only within its own ops.
// CSC buckets need no region: they work in the per-tensor residual.
#include "gflow/reducer.h"

#include <algorithm>
#include <array>
#include <atomic>
#include <cmath>
#include <condition_variable>
#include <cstdlib>
#include <cstring>
#include <functional>
#include <limits>
#include <mutex>
#include <thread>

#include "common/check.h"
#include "common/hash.h"
#include "common/params.h"
#include "common/resource_counts.h"
#include "common/thread_annotations.h"
#include "core/internal.h"
#include "gradient/auto_wire.h"
#include "gradient/bucket_plan.h"
#include "gradient/csc.h"
#include "gradient/fuser.h"
#include "gradient/fusion.h"
#include "gradient/registration.h"
#include "gradient/residuals.h"
#include "gradient/tensor_device.h"
#include "gradient/timeline.h"
#include "kernels/cuda/plugin.h"
#include "kernels/cuda_kernels.h"

namespace gflow {

using gradient::Bucket;
using gradient::BucketPlan;
using gradient::Csc;
using gradient::Fuser;
using gradient::Timeline;
using internal::CommunicatorAccess;

class GradientReducer::Impl {
 public:
  Impl(std::shared_ptr<Communicator> comm, std::vector<Tensor> tensors, ReducerOptions options);
  ~Impl();
  // From `from` (rebuild; null from the constructor): residuals and CSC
  // state; collective, the automatic wire's state from rank 0 (agree()).
  void carryFrom(Impl* from);
  // No step runs from here on: a step in the middle is abandoned (the
  // reducer's communicator aborted, so the peers fail it too), the round
  // thread joined, and the ops in flight waited for. Idempotent.
  void quiesce() GFLOW_EXCLUDES(mutex);

  const ReducerOptions created;  // as the caller passed them (rebuild)
  void ready(size_t index) GFLOW_EXCLUDES(mutex);
  void wait(std::chrono::milliseconds timeout) GFLOW_EXCLUDES(mutex);

  // The reducer's own communicator, split from the caller's at creation: its
  // buckets and rounds never interleave with the caller's ops, and a
  // reducer failure leaves the caller's communicator usable.
  std::shared_ptr<Communicator> comm;
  std::vector<Tensor> tensors;
  std::vector<std::string> names;
  ReduceOp op;
  uint64_t threshold = 0;
  std::chrono::milliseconds cycle{0};
  BucketPlan plan;              // fixed buckets
  uint64_t bucketBytes = 0;     // float32 planning threshold (threshold / density with CSC)
  internal::WireFormat wire;    // automatic: wire.wire is the widest candidate
  std::vector<DataType> wires;  // every wire a float32 bucket may take
  std::optional<gradient::WirePolicyConfig> autoConfig;  // the automatic wire's
  bool errorFeedback = false;                            // residuals_ (a quantized wire)
  gradient::CscConfig sparse;                            // density 0: dense
  // Guards the step's state below (ready() and wait() on the caller's
  // threads, the round thread, the public getters).
  mutable Mutex mutex;
  ReducerStats stats GFLOW_GUARDED_BY(mutex);

 private:
  ErrorContext context(const char* opName) const {
    return ErrorContext::forOp(opName).withRank(comm->rank());
  }
  std::string stepText() const GFLOW_REQUIRES(mutex) { return "step " + std::to_string(step_); }
  char* regionOf(const Bucket& b) {
    return fuser_->packs(b) ? poolData_[static_cast<int>(b.dtype)] + poolOffset_[b.tensors[0]]
                            : nullptr;
  }
  // Queues bucket b (`fixed`: its index in plan, for the automatic wire). A
  // failure (the communicator failed) is kept for wait().
  void fireLocked(const Bucket& b, std::optional<size_t> fixed = std::nullopt)
      GFLOW_REQUIRES(mutex) {
    try {
      gradient::FireOptions o;
      o.step = step_;
      o.stats = &stats;
      o.nonFinite = nonFinite_;
      if (autoWire_ && fixed) {
        o.wire = autoWire_->wire(*fixed);
        o.timed = autoWire_->timer(*fixed);
      }
      gradient::Fired fired = fuser_->fire(b, regionOf(b), std::move(o));
      works_.insert(works_.end(), fired.works.begin(), fired.works.end());
    } catch (const Error& e) {
      if (!stepError_) stepError_ = std::make_shared<const Error>(e);
    }
  }
  // Creation after the split: everything that can fail on one rank only.
  void setUp(const ReducerOptions& options);
  void setUpWire(const ReducerOptions& options);
  void setUpKernels();
  void allocatePool();
  // Wire, CSC and reproducible-mode settings as one number, for the
  // registration check.
  int64_t compressionDigest() const {
    uint64_t h = static_cast<uint64_t>(wire.wire);
    auto mix = [&h](double v) {
      uint64_t bits;
      std::memcpy(&bits, &v, sizeof bits);
      h = hash::mix(h, bits);
    };
    for (DataType w : wires) mix(double(w));
    if (autoConfig) {
      const gradient::WirePolicyConfig& a = *autoConfig;
      for (double v : {double(a.warmupSteps), double(a.probeSteps), double(a.period),
                       double(a.reprobe), a.slack, a.residualLimit}) {
        mix(v);
      }
    }
    for (double v : {double(wire.prescale), double(wire.postscale), double(errorFeedback),
                     sparse.density, double(sparse.chunk), double(sparse.momentum),
                     double(sparse.warmupSteps), double(CommunicatorAccess::reproducible(*comm))}) {
      mix(v);
    }
    return static_cast<int64_t>(h >> 1);
  }
  // Waits for every op fired (ignoring their errors) and starts a new step.
  void abandonStepLocked() GFLOW_REQUIRES(mutex);
  void resetStepLocked() GFLOW_REQUIRES(mutex);
  // wait()'s end of a step whose ops all completed: its trace, counters,
  // non-finite flag and the auto-wire's step; then a new step.
  void finishStepLocked(int64_t beganUs) GFLOW_REQUIRES(mutex);
  void registerBuffers(const std::vector<Tensor>& tensors);
  // What wait() fails the communicator with when tensors were never marked
  // ready (it raises the communicator's own error instead, if it failed).
  std::string missingTensors() GFLOW_REQUIRES(mutex);
  // Cycle-time mode: the round thread's loop, and one round in three parts:
  // the control values (under the lock), their allreduce (without it: its
  // error, or null), and the buckets fired on the answer (under the lock).
  void roundLoop() GFLOW_EXCLUDES(mutex);
  std::vector<int64_t> roundControl() GFLOW_REQUIRES(mutex);
  std::shared_ptr<const Error> exchangeControl(std::vector<int64_t>& ctl) GFLOW_EXCLUDES(mutex);
  void finishRound(const std::vector<int64_t>& ctl, std::shared_ptr<const Error> error)
      GFLOW_REQUIRES(mutex);
  static constexpr int64_t kNoControl = std::numeric_limits<int64_t>::max();

  std::unique_ptr<Timeline> timeline_;
  // Cuda gradients: kernels and device memory (pool, CSC residual); null
  // for cpu gradients, whose steps run on the host kernels.
  std::shared_ptr<kernels::CudaKernels> cudaKernels_;
  std::unique_ptr<Csc> csc_;
  gradient::Residuals residuals_;  // error feedback (a quantized wire)
  std::unique_ptr<Fuser> fuser_;
  std::unique_ptr<gradient::AutoWire> autoWire_;  // automatic wire (fixed buckets)
  // This step's inf/NaN flag (a fresh one per step, so ops of an abandoned
  // step cannot touch the next), and the last completed step's.
  std::shared_ptr<std::atomic<bool>> nonFinite_ GFLOW_GUARDED_BY(mutex);
  bool lastNonFinite_ GFLOW_GUARDED_BY(mutex) = false;

 public:
  bool lastNonFinite() const GFLOW_REQUIRES(mutex) { return lastNonFinite_; }
  std::vector<DataType> currentWires() const GFLOW_REQUIRES(mutex) {
    std::vector<DataType> out;
    for (size_t k = 0; k < plan.buckets.size(); ++k) {
      const bool f32 = plan.buckets[k].dtype == DataType::kFloat32 && !csc_;
      out.push_back(!f32 ? plan.buckets[k].dtype : autoWire_ ? autoWire_->wire(k) : wire.wire);
    }
    return out;
  }

 private:
  std::vector<std::vector<char>> pool_;  // per dtype (cpu gradients)
  std::vector<char*> poolData_;          // per dtype: pool_ or device memory
  std::vector<uint64_t> poolOffset_;     // per tensor (fused ones)
  // The gradients and the pool, registered once for zero-copy transports
  // (verbs) instead of per op; released before the pool is freed.
  std::vector<std::unique_ptr<MemoryRegistration>> registrations_;

  std::condition_variable cv_;
  uint64_t step_ GFLOW_GUARDED_BY(mutex) = 0;
  std::vector<uint8_t> ready_ GFLOW_GUARDED_BY(mutex);  // this step
  size_t readyCount_ GFLOW_GUARDED_BY(mutex) = 0;
  // Per fixed bucket: tensors not ready yet.
  std::vector<size_t> missing_ GFLOW_GUARDED_BY(mutex);
  size_t nextBucket_ GFLOW_GUARDED_BY(mutex) = 0;  // fixed buckets fired so far
  std::vector<std::shared_ptr<WorkState>> works_ GFLOW_GUARDED_BY(mutex);
  // Cycle-time mode.
  std::vector<uint8_t> sent_ GFLOW_GUARDED_BY(mutex);
  uint64_t readyUnsentBytes_ GFLOW_GUARDED_BY(mutex) = 0;
  size_t sentCount_ GFLOW_GUARDED_BY(mutex) = 0;
  bool waiting_ GFLOW_GUARDED_BY(mutex) = false;  // wait() was called this step
  bool roundsDone_ GFLOW_GUARDED_BY(mutex) = false;
  // The step's first error: raised by wait() (fixed buckets: the
  // communicator failed while firing; cycle mode: a round's error).
  std::shared_ptr<const Error> stepError_ GFLOW_GUARDED_BY(mutex);
  bool stop_ GFLOW_GUARDED_BY(mutex) = false;
  std::thread roundThread_;
};

GradientReducer::Impl::Impl(std::shared_ptr<Communicator> parent, std::vector<Tensor> t,
                            ReducerOptions options)
    : created(options), tensors(std::move(t)), names(std::move(options.names)), op(options.op) {
  if (!parent) {
    GFLOW_THROW(kInvalidArgument, ErrorContext{"reducer.create"})
        << "GradientReducer needs a communicator";
  }
  // Collective on the caller's communicator, before anything that can fail
  // on one rank only: from here on such failures fail `comm`, which the
  // peers (in the registration check or a step) see at once.
  comm = parent->split(0, parent->rank());
  CommunicatorAccess::setReproducible(
      *comm, options.reproducible.value_or(CommunicatorAccess::reproducible(*parent)));
  try {
    setUp(options);
  } catch (const Error& e) {
    if (comm->error()) throw;
    CommunicatorAccess::failInvalid(*comm, "reducer.create", e.detail());
  } catch (const std::exception& e) {
    CommunicatorAccess::failInvalid(*comm, "reducer.create",
                                    std::string("cannot set up the reducer: ") + e.what());
  }
  gradient::checkRegistration(
      *comm, tensors, names,
      {op, threshold, static_cast<int64_t>(cycle.count()), compressionDigest()});
  if (cycle.count() > 0) {
    try {
      resources::threadStarted();
      roundThread_ = std::thread([this] { roundLoop(); });
    } catch (const std::exception& e) {
      CommunicatorAccess::failInvalid(*comm, "reducer.create",
                                      std::string("cannot start the round thread: ") + e.what());
    }
  }
}

void GradientReducer::Impl::setUp(const ReducerOptions& options) {
  const char* kCreate = "reducer.create";
  threshold = gradient::thresholdOr(*comm, kCreate, options.fusionThreshold);
  cycle = options.cycleTime.count() >= 0 ? options.cycleTime
                                         : std::chrono::milliseconds(params::cycleTimeMs());
  if (cycle.count() < 0) {
    CommunicatorAccess::failInvalid(*comm, kCreate, "GFLOW_CYCLE_TIME_MS must be >= 0");
  }
  if (static_cast<int>(op) >= kNumReduceOps) {
    CommunicatorAccess::failInvalid(*comm, kCreate,
                                    "invalid reduce op " + std::to_string(static_cast<int>(op)));
  }
  if (!names.empty() && names.size() != tensors.size()) {
    CommunicatorAccess::failInvalid(
        *comm, kCreate,
        std::to_string(names.size()) + " names for " + std::to_string(tensors.size()) + " tensors");
  }
  gradient::validateTensors(*comm, kCreate, tensors, names);
  for (size_t i = 0; i < tensors.size(); ++i) {
    if (supportsReduceOp(tensors[i].dtype, op)) continue;
    CommunicatorAccess::failInvalid(*comm, kCreate,
                                    gradient::describeTensor(i, tensors, names) + ": reduce op " +
                                        toString(op) + " does not apply to its dtype " +
                                        toString(tensors[i].dtype));
  }
  setUpWire(options);
  sparse = gradient::cscConfig(*comm, options.sparse);
  if (autoConfig && (sparse.density > 0 || cycle.count() > 0)) {
    CommunicatorAccess::failInvalid(*comm, kCreate,
                                    std::string("the automatic wire needs fixed buckets and no "
                                                "CSC, but ") +
                                        (sparse.density > 0 ? "CSC is on" : "a cycle time is set"));
  }
  // The timeline file and the pool before the registration check: a rank
  // that cannot create them fails the peers there.
  const std::string spec = options.timeline.empty() ? params::timeline() : options.timeline;
  timeline_ = Timeline::open(spec, comm->rank());
  setUpKernels();
  // With CSC a bucket sends about density * its bytes: buckets of
  // threshold / density keep what travels per bucket near the threshold
  // (large enough for the bandwidth-optimal ring, few norm/pick rounds).
  bucketBytes = threshold;
  if (csc_) {
    bucketBytes = static_cast<uint64_t>(
        std::min(static_cast<double>(threshold) / sparse.density, double(uint64_t(1) << 40)));
  }
  plan = gradient::planBuckets(tensors, threshold, csc_ ? bucketBytes : 0);
  allocatePool();
  if (autoConfig) {
    std::vector<bool> choosable;
    std::vector<std::string> labels;
    for (const Bucket& b : plan.buckets) {
      choosable.push_back(b.dtype == DataType::kFloat32);
      labels.push_back(gradient::bucketLabel(b, names));
    }
    autoWire_ = std::make_unique<gradient::AutoWire>(*comm, *autoConfig, std::move(choosable),
                                                     std::move(labels), timeline_.get());
  }
  // Device memory travels through staging buffers or NCCL, not verbs.
  if (!cudaKernels_) registerBuffers(tensors);
  MutexLock lock(mutex);  // no other thread runs yet
  ready_.assign(tensors.size(), 0);
  sent_.assign(tensors.size(), 0);
  resetStepLocked();
}

// The wire (fixed, GFLOW_WIRE or automatic) and what it implies.
void GradientReducer::Impl::setUpWire(const ReducerOptions& options) {
  const char* kCreate = "reducer.create";
  autoConfig = gradient::autoWireConfig(options);
  DataType fixed = DataType::kFloat32;
  if (!autoConfig) {
    try {
      fixed = options.wire ? *options.wire : parseDataType(params::wire());
    } catch (const Error& e) {
      CommunicatorAccess::failInvalid(*comm, kCreate, "GFLOW_WIRE: " + e.detail());
    }
  }
  wires = autoConfig ? autoConfig->candidates : std::vector<DataType>{fixed};
  wire = internal::WireFormat{wires[0], options.prescale, options.postscale};
  for (DataType w : wires) {
    if (!gradient::isGradientWire(w)) {
      CommunicatorAccess::failInvalid(
          *comm, kCreate,
          std::string("wire type ") + toString(w) +
              ": gradients travel as float32, float16, bfloat16, qint8 or qint4");
    }
    if (isQuantized(w) && !supportsReduceOp(w, op)) {
      CommunicatorAccess::failInvalid(*comm, kCreate,
                                      std::string("reduce op ") + toString(op) +
                                          " does not apply to a " + toString(w) +
                                          " wire (sum, avg, min and max do)");
    }
    errorFeedback = errorFeedback || (isQuantized(w) && options.errorFeedback);
  }
  if (!std::isfinite(wire.prescale) || !std::isfinite(wire.postscale)) {
    CommunicatorAccess::failInvalid(*comm, kCreate, "prescale and postscale must be finite");
  }
}

// The kernels the steps run on (chosen here, once, from the gradients'
// device), CSC's residual and the Fuser.
void GradientReducer::Impl::setUpKernels() {
  std::string why;
  const int device = gradient::commonDevice(nullptr, tensors, names, &why);
  if (device >= 0) {
    // Copy tables: up to three segments per tensor (CSC: gradient,
    // residual, velocity).
    cudaKernels_ = std::make_shared<kernels::CudaKernels>(*cuda::load(nullptr), device,
                                                          tensors[0].stream, 3 * tensors.size());
  }
  if (sparse.density > 0) csc_ = std::make_unique<Csc>(tensors, sparse, cudaKernels_);
  if (errorFeedback && !csc_) residuals_.allocate(tensors, cudaKernels_.get());
  gradient::FuserConfig fc;
  fc.comm = comm.get();
  fc.tensors = &tensors;
  fc.names = &names;
  fc.op = op;
  fc.timeline = timeline_.get();
  fc.wire = wire;
  fc.wires = wires;
  fc.residuals = residuals_.empty() ? nullptr : residuals_.pointers();
  fc.csc = csc_.get();
  fc.kernels = cudaKernels_;
  fuser_ = std::make_unique<Fuser>(std::move(fc));
}

// Fusion-buffer slots and the pool per dtype (device memory for cuda
// gradients).
void GradientReducer::Impl::allocatePool() {
  poolOffset_.assign(tensors.size(), 0);
  std::vector<uint64_t> poolBytes(kNumDataTypes, 0);
  // Fusion-buffer slots: for every tensor a round may pack (cycle-time
  // mode: all but direct ones, and those too when float32 is compressed or
  // sparse), or the tensors of the fixed buckets that are packed.
  // (CSC buckets work in their residual and need no slot.)
  const bool convertsFloat32 =
      std::any_of(wires.begin(), wires.end(), [](DataType w) { return w != DataType::kFloat32; }) &&
      csc_ == nullptr;
  for (size_t i = 0; i < tensors.size(); ++i) {
    const bool packs = cycle.count() > 0
                           ? (tensors[i].nbytes() < threshold &&
                              !(csc_ && tensors[i].dtype == DataType::kFloat32)) ||
                                 (convertsFloat32 && tensors[i].dtype == DataType::kFloat32)
                           : fuser_->packs(plan.buckets[plan.bucketOf[i]]);
    if (!packs) continue;
    uint64_t& used = poolBytes[static_cast<int>(tensors[i].dtype)];
    poolOffset_[i] = used;
    // A quantized wire may take more than a tiny bucket's bytes
    // (Fuser::slack): every float32 slot leaves the room.
    used += tensors[i].nbytes() + (tensors[i].dtype == DataType::kFloat32 ? fuser_->slack() : 0);
  }
  for (uint64_t bytes : poolBytes) {
    pool_.emplace_back(cudaKernels_ ? 0 : bytes);
    poolData_.push_back(cudaKernels_ ? static_cast<char*>(cudaKernels_->allocate(bytes))
                                     : pool_.back().data());
  }
}

GradientReducer::Impl::~Impl() {
  quiesce();
}

void GradientReducer::Impl::quiesce() {
  MutexLock lock(mutex);
  stop_ = true;
  // In the middle of a step the peers wait for buckets or rounds this rank
  // will never issue: abort the reducer's communicator so they fail now.
  if (readyCount_ > 0 || waiting_) {
    CommunicatorAccess::abortWith(
        *comm, Error(ErrorCode::kAborted,
                     "the GradientReducer on rank " + std::to_string(comm->rank()) +
                         " was destroyed in the middle of " + stepText(),
                     context("reducer")));
  }
  cv_.notify_all();
  lock.unlock();
  if (roundThread_.joinable()) roundThread_.join();
  lock.lock();
  // Ops in flight read the tensors and the pool: let them finish.
  abandonStepLocked();
}

void GradientReducer::Impl::registerBuffers(const std::vector<Tensor>& tensors) {
  // Tensors adjacent in memory (views into one flat gradient buffer) share
  // one registration.
  std::vector<std::pair<char*, size_t>> ranges;
  for (const Tensor& t : tensors) {
    char* p = static_cast<char*>(t.data);
    if (!ranges.empty() && ranges.back().first + ranges.back().second == p) {
      ranges.back().second += t.nbytes();
    } else if (t.nbytes() > 0) {
      ranges.emplace_back(p, t.nbytes());
    }
  }
  for (auto& b : pool_) {
    if (!b.empty()) ranges.emplace_back(b.data(), b.size());
  }
  for (auto& r : ranges) registrations_.push_back(comm->registerMemory(r.first, r.second));
}

void GradientReducer::Impl::resetStepLocked() {
  nonFinite_ = std::make_shared<std::atomic<bool>>(false);
  std::fill(ready_.begin(), ready_.end(), 0);
  std::fill(sent_.begin(), sent_.end(), 0);
  readyCount_ = 0;
  missing_.assign(plan.buckets.size(), 0);
  for (size_t b = 0; b < plan.buckets.size(); ++b) missing_[b] = plan.buckets[b].tensors.size();
  nextBucket_ = 0;
  works_.clear();
  readyUnsentBytes_ = 0;
  sentCount_ = 0;
  waiting_ = false;
  roundsDone_ = tensors.empty();
  stepError_.reset();
  if (autoWire_) autoWire_->resetStep();
}

void GradientReducer::Impl::abandonStepLocked() {
  for (auto& w : works_) {
    try {
      w->wait(std::chrono::milliseconds(0));
    } catch (const Error&) {
    }
  }
  resetStepLocked();
}

void GradientReducer::Impl::ready(size_t index) {
  MutexLock lock(mutex);
  if (index >= tensors.size()) {
    GFLOW_THROW(kInvalidArgument, context("reducer.ready"))
        << "ready(" << index << "): the reducer has " << tensors.size() << " tensors";
  }
  if (ready_[index]) {
    GFLOW_THROW(kInvalidArgument, context("reducer.ready"))
        << "ready() called twice in " << stepText() << " for "
        << gradient::describeTensor(index, tensors, names);
  }
  ready_[index] = 1;
  ++readyCount_;
  if (autoWire_) autoWire_->tensorReady();
  if (timeline_) {
    timeline_->instant(
        "ready: " + (index < names.size() ? names[index] : "tensor " + std::to_string(index)),
        "ready", Timeline::kCompute, gradient::jsonArgs({{"step", step_}, {"tensor", index}}));
  }
  if (cycle.count() > 0) {
    readyUnsentBytes_ += tensors[index].nbytes();
    cv_.notify_all();
    return;
  }
  if (--missing_[plan.bucketOf[index]] == 0 && autoWire_) {
    autoWire_->bucketReady(plan.bucketOf[index]);
  }
  // Buckets fire in plan order on every rank: a complete bucket waits for
  // the ones before it.
  while (nextBucket_ < plan.buckets.size() && missing_[nextBucket_] == 0) {
    fireLocked(plan.buckets[nextBucket_], nextBucket_);
    ++nextBucket_;
  }
}

// Fixed buckets: the peers are (or will be) waiting in the allreduce of a
// bucket this rank can never fire; failing the communicator gives them this
// error instead.
std::string GradientReducer::Impl::missingTensors() {
  // ready() could not fire a bucket because the communicator had failed:
  // that is the error to report, not its consequence.
  if (auto e = stepError_ ? stepError_ : comm->error()) {
    abandonStepLocked();
    throw *e;
  }
  std::string list;
  size_t count = 0;
  for (size_t i = 0; i < tensors.size(); ++i) {
    if (ready_[i]) continue;
    if (++count <= 3) list += (count > 1 ? ", " : "") + gradient::describeTensor(i, tensors, names);
  }
  if (count > 3) list += ", ...";
  return "wait() in " + stepText() + " on rank " + std::to_string(comm->rank()) + " while " +
         std::to_string(count) + " tensor(s) were never marked ready: " + list;
}

void GradientReducer::Impl::wait(std::chrono::milliseconds timeout) {
  const int64_t begin = Timeline::nowUs();
  // One deadline for the whole call (0: each op's own deadline).
  const auto deadline = std::chrono::steady_clock::now() + timeout;
  auto remaining = [&] {
    if (timeout.count() <= 0) return std::chrono::milliseconds(0);
    const auto left = std::chrono::duration_cast<std::chrono::milliseconds>(
        deadline - std::chrono::steady_clock::now());
    return std::max(left, std::chrono::milliseconds(1));
  };
  MutexLock lock(mutex);
  // Only this call moves to the next step: its text holds while unlocked.
  const std::string step = stepText();
  auto timedOut = [&]() -> Error {
    return Error(ErrorCode::kTimeout,
                 "GradientReducer::wait gave up after " + std::to_string(timeout.count()) +
                     " ms in " + step + "; the step is still running",
                 context("wait"));
  };
  if (autoWire_) autoWire_->waitCalled();
  if (cycle.count() == 0 && readyCount_ < tensors.size()) {
    const std::string what = missingTensors();
    lock.unlock();  // failing the communicator runs without the lock
    try {
      CommunicatorAccess::failInvalid(*comm, "reducer.wait", what);
    } catch (const Error&) {
      lock.lock();
      abandonStepLocked();
      throw;
    }
  }
  if (cycle.count() > 0) {
    waiting_ = true;
    cv_.notify_all();
    while (!roundsDone_ && !stepError_ && !stop_) {
      if (timeout.count() <= 0) {
        lock.wait(cv_);
      } else if (lock.waitUntil(cv_, deadline) == std::cv_status::timeout && !roundsDone_ &&
                 !stepError_ && !stop_) {
        throw timedOut();
      }
    }
  }
  if (stepError_) {
    auto e = stepError_;
    abandonStepLocked();  // what was already fired still completes
    throw *e;
  }
  std::vector<std::shared_ptr<WorkState>> works = works_;
  lock.unlock();
  try {
    for (auto& w : works) w->wait(remaining());
  } catch (const Error& e) {
    if (e.code() == ErrorCode::kTimeout && e.op() == "wait") throw timedOut();  // goes on
    lock.lock();
    abandonStepLocked();
    throw;
  }
  lock.lock();
  finishStepLocked(begin);
}

void GradientReducer::Impl::finishStepLocked(int64_t begin) {
  if (timeline_) {
    timeline_->span("wait", "wait", Timeline::kCompute, begin, Timeline::nowUs(),
                    gradient::jsonArgs({{"step", step_}}));
    timeline_->flush();
  }
  ++stats.steps;
  ++step_;
  lastNonFinite_ = nonFinite_->load();
  // The caller skips such a step; CSC must not carry its inf/NaN (or the
  // loss scale it was computed at) into later steps. Every rank agrees.
  if (lastNonFinite_ && csc_) csc_->reset();
  if (autoWire_) {
    // Every rank agrees at the same step (a small allreduce when due); its
    // failure is this wait()'s error, after the step is done.
    try {
      std::function<std::vector<double>()> ratios;
      if (!residuals_.empty()) {
        // Called by stepDone below, under the lock this function holds.
        ratios = [this]() GFLOW_NO_THREAD_SAFETY_ANALYSIS {
          return gradient::residualRatios(plan, tensors, residuals_.get(), currentWires(),
                                          cudaKernels_.get());
        };
      }
      stats.wireChanges += autoWire_->stepDone(step_ - 1, lastNonFinite_, ratios);
    } catch (const Error&) {
      resetStepLocked();
      throw;
    }
  }
  resetStepLocked();
}

// ---- Cycle-time mode: negotiated rounds ------------------------------------

void GradientReducer::Impl::roundLoop() {
  MutexLock lock(mutex);
  auto lastRound = std::chrono::steady_clock::now();
  while (!stop_) {
    const bool active = !roundsDone_ && !stepError_ && (readyCount_ > 0 || waiting_);
    const bool pending = active && readyUnsentBytes_ > 0;
    const bool due = pending && std::chrono::steady_clock::now() >= lastRound + cycle;
    if (active &&
        (due || waiting_ || readyUnsentBytes_ >= bucketBytes || readyCount_ == tensors.size())) {
      std::vector<int64_t> ctl = roundControl();
      lock.unlock();  // the round's allreduce runs without the lock
      std::shared_ptr<const Error> error = exchangeControl(ctl);
      lock.lock();
      finishRound(ctl, std::move(error));
      lastRound = std::chrono::steady_clock::now();
      cv_.notify_all();
    } else if (pending) {
      lock.waitUntil(cv_, lastRound + cycle);
    } else {
      lock.wait(cv_);
    }
  }
}

// One round: agree on the tensors ready everywhere and fire them. Every rank
// gets the same answer, so every rank fires the same buckets and sees the
// step end in the same round. Errors go to stepError_ (raised by wait()).
//
// Per tensor: 1 if ready here (min over ranks: ready everywhere). Last:
// rank * n + tensor for the first tensor this rank's wait() found never
// marked ready (min over ranks: the lowest such rank, with its tensor);
// kNoControl where none.
std::vector<int64_t> GradientReducer::Impl::roundControl() {
  const size_t n = tensors.size();
  std::vector<int64_t> ctl(n + 1, kNoControl);
  for (size_t i = 0; i < n; ++i) ctl[i] = ready_[i];
  if (waiting_ && readyCount_ < n) {
    const size_t first =
        static_cast<size_t>(std::find(ready_.begin(), ready_.end(), 0) - ready_.begin());
    ctl[n] = static_cast<int64_t>(static_cast<size_t>(comm->rank()) * n + first);
  }
  ++stats.controlOps;
  return ctl;
}

std::shared_ptr<const Error> GradientReducer::Impl::exchangeControl(std::vector<int64_t>& ctl) {
  try {
    comm->allreduce(Tensor(ctl.data(), ctl.size(), DataType::kInt64), ReduceOp::kMin);
  } catch (const Error& e) {
    return std::make_shared<const Error>(e);
  } catch (const std::exception& e) {
    return std::make_shared<const Error>(
        ErrorCode::kInternal, std::string("round failed: ") + e.what(), context("reducer.round"));
  }
  return nullptr;
}

void GradientReducer::Impl::finishRound(const std::vector<int64_t>& ctl,
                                        std::shared_ptr<const Error> error) {
  const size_t n = tensors.size();
  if (!error && stop_) {
    error = std::make_shared<const Error>(ErrorCode::kAborted, "the reducer is being destroyed",
                                          context("reducer.round"));
  }
  if (!error && ctl[n] != kNoControl) {
    const auto rank = static_cast<size_t>(ctl[n]) / n, tensor = static_cast<size_t>(ctl[n]) % n;
    error = std::make_shared<const Error>(
        ErrorCode::kInvalidArgument,
        "rank " + std::to_string(rank) + " called wait() in " + stepText() + " while " +
            gradient::describeTensor(tensor, tensors, names) + " was never marked ready there",
        context("reducer.wait"));
  }
  if (error) {
    if (!stepError_) stepError_ = error;
    return;
  }
  std::vector<size_t> agreed;
  for (size_t i = 0; i < n; ++i) {
    if (ctl[i] == 1 && !sent_[i]) {
      agreed.push_back(i);
      sent_[i] = 1;
      readyUnsentBytes_ -= tensors[i].nbytes();
    }
  }
  try {
    for (const Bucket& b :
         gradient::planSubset(tensors, threshold, agreed, csc_ ? bucketBytes : 0).buckets) {
      fireLocked(b);
    }
  } catch (const std::exception& e) {
    if (!stepError_) {
      stepError_ = std::make_shared<const Error>(
          ErrorCode::kInternal, std::string("round failed: ") + e.what(), context("reducer.round"));
    }
  }
  if (stepError_) return;
  sentCount_ += agreed.size();
  if (sentCount_ == n) roundsDone_ = true;
}

// ---- Public API -------------------------------------------------------------

GradientReducer::GradientReducer(std::shared_ptr<Communicator> comm, std::vector<Tensor> gradients,
                                 ReducerOptions options)
    : impl_(std::make_unique<Impl>(std::move(comm), std::move(gradients), std::move(options))) {
  impl_->carryFrom(nullptr);
}

GradientReducer::~GradientReducer() = default;

void GradientReducer::Impl::carryFrom(Impl* from) {
  if (from && csc_ && from->csc_) csc_->carryFrom(*from->csc_);
  if (from) residuals_.carryFrom(from->residuals_, tensors);
  if (autoWire_) autoWire_->agree(from ? from->autoWire_.get() : nullptr);
}

void GradientReducer::rebuild(std::shared_ptr<Communicator> comm) {
  impl_->quiesce();  // nothing of a step in the middle touches the residuals now
  auto next = std::make_unique<Impl>(std::move(comm), impl_->tensors, impl_->created);
  next->carryFrom(impl_.get());
  impl_ = std::move(next);
}

void GradientReducer::ready(size_t index) {
  impl_->ready(index);
}

void GradientReducer::wait(std::chrono::milliseconds timeout) {
  impl_->wait(timeout);
}

size_t GradientReducer::numTensors() const {
  return impl_->tensors.size();
}

std::vector<std::vector<size_t>> GradientReducer::buckets() const {
  std::vector<std::vector<size_t>> out;
  for (const Bucket& b : impl_->plan.buckets) out.push_back(b.tensors);
  return out;
}

const Communicator& GradientReducer::communicator() const {
  return *impl_->comm;
}

uint64_t GradientReducer::fusionThreshold() const {
  return impl_->threshold;
}

bool GradientReducer::nonFinite() const {
  MutexLock lock(impl_->mutex);
  return impl_->lastNonFinite();
}

std::vector<DataType> GradientReducer::wires() const {
  MutexLock lock(impl_->mutex);
  return impl_->currentWires();
}

ReducerStats GradientReducer::stats() const {
  MutexLock lock(impl_->mutex);
  return impl_->stats;
}

}  // namespace gflow
