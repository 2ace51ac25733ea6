#include "gradient/auto_wire.h"

#include <algorithm>
#include <cmath>

#include "common/check.h"
#include "common/logging.h"
#include "common/params.h"
#include "common/text.h"
#include "common/tick_clock.h"
#include "core/internal.h"
#include "kernels/host_kernels.h"

namespace gflow::gradient {

namespace {

const char* kCreate = "reducer.create";

// Bytes one float32 value takes on `t` (quantized: with the block's scale).
double widthOf(DataType t) {
  return static_cast<double>(wireElements(t, kQuantBlock) * dataTypeSize(t)) / kQuantBlock;
}

// GFLOW_WIRE_AUTO_CANDIDATES: names separated by commas (spaces allowed).
std::vector<DataType> parseCandidates(const std::string& spec) {
  std::vector<DataType> out;
  for (const std::string& item : text::splitList(spec)) {
    try {
      out.push_back(parseDataType(item));
    } catch (const Error& e) {
      GFLOW_THROW(kInvalidArgument, ErrorContext{kCreate})
          << "GFLOW_WIRE_AUTO_CANDIDATES='" << spec << "': " << e.detail();
    }
  }
  return out;
}

void checkCandidates(const std::vector<DataType>& c) {
  if (c.empty())
    GFLOW_THROW(kInvalidArgument, ErrorContext{kCreate}) << "no automatic wire candidates";
  for (size_t i = 0; i < c.size(); ++i) {
    if (!isGradientWire(c[i])) {
      GFLOW_THROW(kInvalidArgument, ErrorContext{kCreate})
          << "automatic wire candidate " << toString(c[i])
          << ": gradients travel as float32, float16, bfloat16, qint8 or qint4";
    }
    if (std::find(c.begin(), c.begin() + i, c[i]) != c.begin() + i) {
      GFLOW_THROW(kInvalidArgument, ErrorContext{kCreate})
          << "automatic wire candidate " << toString(c[i]) << " is listed twice";
    }
    if (i > 0 && widthOf(c[i]) > widthOf(c[i - 1])) {
      GFLOW_THROW(kInvalidArgument, ErrorContext{kCreate})
          << "automatic wire candidates must be listed widest first: " << toString(c[i])
          << " is wider than " << toString(c[i - 1]);
    }
  }
}

uint64_t countOr(int64_t given, int64_t fromEnv, const char* what, int64_t least) {
  const int64_t v = given >= 0 ? given : fromEnv;
  if (v < least) {
    GFLOW_THROW(kInvalidArgument, ErrorContext{kCreate})
        << "automatic wire: " << what << " must be >= " << least << ", got " << v;
  }
  return static_cast<uint64_t>(v);
}

}  // namespace

bool isGradientWire(DataType t) {
  return t == DataType::kFloat32 || t == DataType::kFloat16 || t == DataType::kBFloat16 ||
         isQuantized(t);
}

std::optional<WirePolicyConfig> autoWireConfig(const ReducerOptions& o) {
  const AutoWireOptions& a = o.autoWire;
  const bool on = a.enabled.value_or(!o.wire && params::wire() == "auto");
  if (!on) return std::nullopt;
  if (o.wire) {
    GFLOW_THROW(kInvalidArgument, ErrorContext{kCreate})
        << "wire " << toString(*o.wire) << " and the automatic wire are both set";
  }
  return policyConfig(a);
}

WirePolicyConfig policyConfig(const AutoWireOptions& a) {
  WirePolicyConfig c;
  c.candidates =
      a.candidates.empty() ? parseCandidates(params::wireAutoCandidates()) : a.candidates;
  checkCandidates(c.candidates);
  c.warmupSteps = countOr(a.warmupSteps, params::wireAutoWarmup(), "warmupSteps", 0);
  c.period = countOr(a.period, params::wireAutoPeriod(), "period", 1);
  c.reprobe = countOr(a.reprobe, params::wireAutoReprobe(), "reprobe", 0);
  c.probeSteps = countOr(a.probeSteps, -1, "probeSteps", 1);  // no parameter: < 1 is an error
  if (!(a.slack >= 0 && a.slack <= 10) || !(a.residualLimit > 0)) {
    GFLOW_THROW(kInvalidArgument, ErrorContext{kCreate})
        << "automatic wire: slack must be in [0, 10] and residualLimit > 0";
  }
  c.slack = a.slack;
  c.residualLimit = a.residualLimit;
  return c;
}

// Times of one step, in TickClock ticks.
struct AutoWire::StepTimes {
  explicit StepTimes(size_t buckets) : ready(buckets, -1), begin(buckets), end(buckets) {
    for (auto& b : begin) b.store(-1);
    for (auto& e : end) e.store(-1);
  }
  int64_t start = -1;
  int64_t wait = -1;
  std::vector<int64_t> ready;
  std::vector<std::atomic<int64_t>> begin, end;  // written by the ops
};

AutoWire::AutoWire(Communicator& comm, WirePolicyConfig config, std::vector<bool> choosable,
                   std::vector<std::string> labels, Timeline* timeline)
    : comm_(comm),
      policy_(std::move(config), std::move(choosable)),
      labels_(std::move(labels)),
      timeline_(timeline) {
  resetStep();
}

void AutoWire::resetStep() {
  times_ = std::make_shared<StepTimes>(numBuckets());
}

void AutoWire::tensorReady() {
  if (times_->start < 0) times_->start = TickClock::now();
}

void AutoWire::bucketReady(size_t bucket) {
  tensorReady();
  times_->ready[bucket] = TickClock::now();
}

std::function<void(int64_t, int64_t)> AutoWire::timer(size_t bucket) {
  return [t = times_, bucket](int64_t begin, int64_t end) {
    t->begin[bucket].store(begin);
    t->end[bucket].store(end);
  };
}

void AutoWire::bucketDone(size_t bucket) {
  times_->end[bucket].store(TickClock::now());
}

void AutoWire::waitCalled() {
  times_->wait = TickClock::now();
}

StepSample AutoWire::sample() const {
  const StepTimes& t = *times_;
  auto seconds = [](int64_t ticks) { return TickClock::toNs(ticks) * 1e-9; };
  auto since = [&](int64_t at) { return at < 0 ? 0.0 : seconds(at - t.start); };
  StepSample s;
  int64_t lastReady = -1, previousEnd = -1;
  for (size_t b = 0; b < numBuckets(); ++b) {
    s.ready.push_back(since(t.ready[b]));
    lastReady = std::max(lastReady, t.ready[b]);
    int64_t begin = t.begin[b].load();
    const int64_t end = t.end[b].load();
    if (begin < 0) begin = std::max(t.ready[b], previousEnd);  // untimed: from when it could run
    s.cost.push_back(begin < 0 || end < begin ? -1.0 : seconds(end - begin));
    previousEnd = std::max(previousEnd, end);
  }
  s.wait = since(t.wait >= 0 ? t.wait : lastReady);
  return s;
}

// The residual guard's reading (device copies, or a Python callback) runs
// on this rank alone, just before the agreement: when it fails, the peers
// must not wait in the agreement for this rank until their timeout. The
// communicator fails with the error, which reaches them now; this rank
// throws it (another exception, such as a Python one, as it is).
std::vector<double> AutoWire::readResiduals(
    const std::function<std::vector<double>()>& residualRatios) {
  if (!residualRatios) return {};
  const int rank = comm_.rank();
  auto failWith = [&](ErrorCode code, const std::string& why) {
    Error failed(code,
                 "the automatic wire's residual guard on rank " + std::to_string(rank) +
                     " could not read the residuals: " + why,
                 ErrorContext::forOp("reducer.wait").withRank(rank));
    internal::CommunicatorAccess::abortWith(comm_, failed);
    return failed;
  };
  try {
    return residualRatios();
  } catch (const Error& e) {
    throw failWith(e.code(), e.detail());
  } catch (const std::exception& e) {
    failWith(ErrorCode::kInternal, e.what());
    throw;
  }
}

void AutoWire::agree(const AutoWire* carried) {
  if (comm_.rank() == 0 && carried) policy_.restore(carried->policy_.state());  // false: fresh
  std::vector<double> state = policy_.state();
  int64_t length = static_cast<int64_t>(state.size());
  comm_.broadcast(Tensor(&length, 1, DataType::kInt64), 0);
  // A fresh state is as long as any but for a rejected pick (a level per bucket).
  const bool fits = length > 0 && static_cast<uint64_t>(length) <= state.size() + numBuckets() + 1;
  state.resize(fits ? static_cast<size_t>(length) : 0);
  if (fits) comm_.broadcast(Tensor(state.data(), state.size(), DataType::kFloat64), 0);
  if (!fits || !policy_.restore(state)) {
    const int rank = comm_.rank();
    Error e(ErrorCode::kMismatch,
            "the automatic wire's state on rank 0 does not fit the buckets of rank " +
                std::to_string(rank) + " (GradientReducer::rebuild or a joiner's reducer)",
            ErrorContext::forOp("reducer.create").withRank(rank));
    internal::CommunicatorAccess::abortWith(comm_, e);
    throw e;
  }
}

uint64_t AutoWire::stepDone(uint64_t step, bool nonFinite,
                            const std::function<std::vector<double>()>& residualRatios) {
  StepSample s = sample();
  const int64_t now = TickClock::now();
  if (lastDone_ >= 0) s.step = TickClock::toNs(now - lastDone_) * 1e-9;
  lastDone_ = now;
  resetStep();
  std::vector<WireChange> changes = policy_.record(s, nonFinite);
  report(step, changes);
  uint64_t changed = changes.size();
  if (policy_.agreementDue()) {
    std::vector<double> v = policy_.window(readResiduals(residualRatios));
    comm_.allreduce(Tensor(v.data(), v.size(), DataType::kFloat64), ReduceOp::kMax);
    changes = policy_.decide(v);
    report(step, changes);
    changed += changes.size();
  }
  return changed;
}

namespace {
constexpr size_t kSampleBlock = 1024, kSampleBlocks = 64;

// p[0, count) into `out` through `memory`: all of it up to kSampleBlocks *
// kSampleBlock values, else kSampleBlocks blocks of kSampleBlock spread
// evenly from the first value to the last.
void readSample(kernels::GradientKernels& memory, const float* p, size_t count,
                std::vector<float>& out) {
  const size_t blocks = count <= kSampleBlocks * kSampleBlock ? 1 : kSampleBlocks;
  const size_t len = blocks == 1 ? count : kSampleBlock;
  out.resize(blocks * len);
  std::vector<kernels::GradientKernels::Copy> copies;
  for (size_t j = 0; j < blocks; ++j) {
    const size_t at = blocks == 1 ? 0 : j * (count - len) / (blocks - 1);
    copies.push_back({p + at, out.data() + j * len, len * sizeof(float)});
  }
  memory.toHost(copies);
}

double l1(const std::vector<float>& v) {
  double s = 0;
  for (float x : v) s += std::fabs(x);
  return s;
}
}  // namespace

std::vector<double> residualRatios(const BucketPlan& plan, const std::vector<Tensor>& tensors,
                                   const std::vector<float*>& residuals,
                                   const std::vector<DataType>& wires,
                                   kernels::GradientKernels* device) {
  kernels::GradientKernels& memory = device ? *device : *kernels::hostKernels();
  std::vector<double> out(plan.buckets.size(), 0.0);
  std::vector<float> sample;
  for (size_t b = 0; b < plan.buckets.size(); ++b) {
    if (plan.buckets[b].dtype != DataType::kFloat32 || !isQuantized(wires[b])) continue;
    double r = 0, g = 0;
    for (size_t i : plan.buckets[b].tensors) {
      if (!residuals[i]) continue;
      readSample(memory, residuals[i], tensors[i].count, sample);
      r += l1(sample);
      readSample(memory, static_cast<const float*>(tensors[i].data), tensors[i].count, sample);
      g += l1(sample);
    }
    out[b] = g > 0 && std::isfinite(r / g) ? r / g : (r > 0 ? 1e300 : 0.0);
  }
  return out;
}

void AutoWire::report(uint64_t step, const std::vector<WireChange>& changes) const {
  for (const WireChange& c : changes) {
    const std::string& label = labels_[c.bucket];
    const bool probe = c.reason == "probe";
    if (comm_.rank() == 0 && (!probe || log::enabled(log::Level::DEBUG))) {
      GFLOW_LOG(INFO) << "automatic wire, step " << step << ": bucket " << c.bucket << " (" << label
                      << ") " << toString(c.from) << " -> " << toString(c.to) << ": " << c.reason;
    }
    if (timeline_) {
      timeline_->instant(
          "wire " + std::string(toString(c.to)) + ": " + label, "wire", Timeline::kComm,
          jsonArgs({{"step", step}, {"bucket", c.bucket}}) +
              ", \"from\": " + jsonString(toString(c.from)) +
              ", \"to\": " + jsonString(toString(c.to)) + ", \"reason\": " + jsonString(c.reason));
    }
  }
}

}  // namespace gflow::gradient
