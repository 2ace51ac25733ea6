// AutoWire: the automatic wire (ReducerOptions::autoWire,
// docs/compression.md) around a WirePolicy, for the GradientReducer and for
// WireChooser (callers that issue each bucket's allreduce themselves, such
// as gflow.torch's auto hook): it times each step (when each bucket is
// ready, how long its op runs, when backward ended), feeds the policy,
// agrees with the peers when the policy asks (one small float64
// max-allreduce on the owner's communicator, at the same step on every
// rank), and logs every change of wire and puts it in the timeline.
//
// The owner serialises the calls (the reducer: its mutex); the per-step
// timing slots are written by the ops' threads and read once the owner has
// seen every op of the step complete.
#pragma once

#include <atomic>
#include <cstdint>
#include <functional>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "gflow/communicator.h"
#include "gflow/reducer.h"
#include "gradient/bucket_plan.h"
#include "gradient/timeline.h"
#include "gradient/wire_policy.h"
#include "kernels/gradient_kernels.h"

namespace gflow::gradient {

// Whether float32 gradients may travel as `t` (float32, float16, bfloat16,
// qint8, qint4).
bool isGradientWire(DataType t);

// The automatic wire's settings from `o` and the GFLOW_WIRE_AUTO_*
// parameters, or nullopt when it is off. Throws gflow::Error
// (kInvalidArgument) naming what is wrong.
std::optional<WirePolicyConfig> autoWireConfig(const ReducerOptions& o);
// The same from AutoWireOptions alone (on).
WirePolicyConfig policyConfig(const AutoWireOptions& a);

// The L1 ratio residual / gradient of each bucket of `plan` whose wire is
// quantized (0 for the others). Each tensor is read whole up to 64 Ki
// values, else as 64 blocks of 1024 spread evenly over it (the guard needs
// a magnitude, not digits), through `device`'s toHost (its gradients and
// residuals are that device's memory; null: host memory). A residual beside
// a zero gradient counts as 1e300.
std::vector<double> residualRatios(const BucketPlan& plan, const std::vector<Tensor>& tensors,
                                   const std::vector<float*>& residuals,
                                   const std::vector<DataType>& wires,
                                   kernels::GradientKernels* device);

class AutoWire {
 public:
  // `choosable[b]`: bucket b holds float32 data; `labels[b]` names it in
  // the log and the timeline.
  AutoWire(Communicator& comm, WirePolicyConfig config, std::vector<bool> choosable,
           std::vector<std::string> labels, Timeline* timeline);

  DataType wire(size_t bucket) const { return policy_.wire(bucket); }
  size_t numBuckets() const { return policy_.numBuckets(); }

  // Step events, from the owner's threads in its step's order.
  void tensorReady();  // any ready(): the first one starts the step's clock
  void bucketReady(size_t bucket);
  // For FireOptions::timed of bucket `bucket` in this step.
  std::function<void(int64_t, int64_t)> timer(size_t bucket);
  // Bucket `bucket`'s op completed (when the owner cannot time its run:
  // its cost is then counted from when it could start, the later of its
  // ready() and the previous bucket's completion).
  void bucketDone(size_t bucket);
  void waitCalled();  // unset: the last bucketReady()
  // The step completed on this rank (every rank reaches it at the same
  // step, with the same nonFinite): records it, and when due asks for
  // `residualRatios` (may be null: none), agrees with the peers (a small
  // allreduce on comm) and decides. Throws the agreement's error; when
  // `residualRatios` throws, fails comm with it (the peers get it instead of
  // waiting in the agreement) and throws it. Returns
  // the number of buckets whose wire changed. Starts a new step.
  uint64_t stepDone(uint64_t step, bool nonFinite,
                    const std::function<std::vector<double>()>& residualRatios);
  // Starts a new step without recording (an abandoned one).
  void resetStep();
  // Collective over comm, once before the first step: every rank takes
  // rank 0's policy, which is `carried`'s (GradientReducer::rebuild: the
  // old communicator's automatic wire, with the same buckets) where rank 0
  // has one, else its own fresh one. So survivors keep their choices and a
  // joiner takes them up. Throws kMismatch (failing comm, so the peers fail
  // too) where rank 0's state does not fit this rank's buckets.
  void agree(const AutoWire* carried);

 private:
  struct StepTimes;
  StepSample sample() const;
  std::vector<double> readResiduals(const std::function<std::vector<double>()>& residualRatios);
  void report(uint64_t step, const std::vector<WireChange>& changes) const;

  Communicator& comm_;
  WirePolicy policy_;
  std::vector<std::string> labels_;
  Timeline* timeline_;
  std::shared_ptr<StepTimes> times_;
  int64_t lastDone_ = -1;  // when the last step was done (TickClock)
};

}  // namespace gflow::gradient
