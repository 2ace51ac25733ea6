// Lazy allreduce with chunk fusion: the per-step gradient API of a custom
// training loop (GradientFlow's "lazy allreduce").
//
//   std::vector<gflow::Tensor> grads = ...;        // in the order backward makes them
//   gflow::GradientReducer reducer(comm, grads);   // collective, once
//   for (each step) {
//     for (i in backward order) { compute grad i; reducer.ready(i); }
//     reducer.wait();                              // grads now averaged in place
//   }
//
// The gradients are cut, in registration order, into buckets of about
// fusionThreshold bytes (one dtype per bucket; a tensor of at least the
// threshold is a bucket of its own and is reduced in place without a copy;
// so is a bucket whose tensors lie back to back in memory, e.g. views into
// one flat gradient buffer laid out in registration order).
// A bucket fires as soon as all its tensors are ready and every earlier
// bucket has fired, so buckets fire in the same order on every rank even when
// ranks produce gradients in different orders (a rank that is ahead only
// waits). Firing packs the bucket's tensors into a persistent fusion buffer,
// allreduces it and unpacks it, all on the communicator's progress thread:
// ready() never blocks the training thread.
//
// With a cycle time (GFLOW_CYCLE_TIME_MS > 0) the ranks instead agree, in
// rounds, on which tensors are ready everywhere (a small allreduce of a ready
// bitmap) and fuse exactly those: a round starts when the bytes ready but not
// yet sent reach the threshold, when every tensor is ready, or when the cycle
// time has passed since the last round with something waiting. Worth it when
// ranks produce gradients in very different orders; costs one small
// allreduce per round.
//
// The reducer runs its collectives on its own communicator, split from
// `comm` at creation: they never interleave with other ops on `comm` (which
// may run at the same time), and a reducer failure leaves `comm` usable.
//
// Errors (gflow::Error naming the tensor, the ranks and the op):
// - ready() of an index out of range, or twice in one step: kInvalidArgument,
//   raised by ready() with nothing changed; ready() raises nothing else;
// - wait() while a tensor was never marked ready: kInvalidArgument. Fixed
//   buckets: on this rank, and the reducer's communicator fails so the peers
//   waiting for that bucket get the same error from their wait() (the reducer
//   cannot be used again). Cycle-time mode: every rank's wait() raises it
//   (the round carries it) and the next step starts clean;
// - registrations that differ across ranks (count, dtype, order, op,
//   threshold or cycle time): kMismatch from the constructor on every rank,
//   naming the first tensor that differs;
// - a peer that dies, stops or fails: its error from wait();
// - destroying a reducer in the middle of a step aborts the reducer's
//   communicator: the peers' wait() raises an error (kAborted or
//   kPeerLost) saying that this rank's reducer was destroyed mid-step.
#pragma once

#include <chrono>
#include <cstdint>
#include <functional>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "gflow/communicator.h"
#include "gflow/export.h"
#include "gflow/types.h"

namespace gflow {

// Coarse-grained sparse communication (docs/compression.md): each float32
// bucket is cut into chunks; only the top `density` fraction of chunks by L1
// norm (the same on every rank) travels, the rest accumulate locally. With
// CSC, buckets hold fusionThreshold / density bytes, so that about the
// threshold travels per bucket.
struct SparseOptions {
  // Fraction of chunks sent per step, in (0, 1]; 0: dense (off); negative:
  // GFLOW_CSC_DENSITY (default 0).
  double density = -1;
  // Elements per chunk; 0: GFLOW_CSC_CHUNK.
  size_t chunk = 0;
  // > 0: momentum correction (Deep Gradient Compression): the reducer keeps
  // a velocity u = momentum * u + g per element and accumulates u instead of
  // g; the optimizer then applies the result as plain SGD (no momentum).
  float momentum = 0.0f;
  // The first steps send every chunk (dense warm-up).
  uint64_t warmupSteps = 0;
};

// The reducer's automatic wire (wire "auto", GFLOW_WIRE=auto;
// docs/compression.md, Automatic wire): it picks each float32 bucket's wire
// among `candidates` from what it measures. Steps 0 .. warmupSteps run
// dense; then every candidate runs on every bucket for a few steps (a
// probe) while each bucket's time on the wire and each step's time are
// measured. The ranks agree on the measurements (one small allreduce in
// wait(), at the same step on every rank) and every rank picks the same
// wires: the fastest uniform wire as measured, or a per-bucket pick that
// keeps early buckets (which backward hides) wider, kept only if a trial
// of probeSteps steps confirms its step time within `slack`. Every `reprobe` periods
// the probe repeats. A guard widens a bucket at once when a step's result
// holds an inf or NaN, and at a period's end when its error-feedback
// residual exceeds `residualLimit` times its gradient (L1); such a bucket
// narrows again only after some periods without trouble. Every change is
// logged (INFO, rank 0) and is an instant in the timeline. Needs fixed
// buckets (no cycle time) and no CSC.
struct AutoWireOptions {
  // Unset: on when GFLOW_WIRE is "auto" and `wire` is unset.
  std::optional<bool> enabled;
  // Wires to pick from (float32, float16, bfloat16, qint8, qint4), widest
  // first; the first is the warm-up's. Empty: GFLOW_WIRE_AUTO_CANDIDATES.
  std::vector<DataType> candidates;
  // Negative: GFLOW_WIRE_AUTO_WARMUP, GFLOW_WIRE_AUTO_PERIOD,
  // GFLOW_WIRE_AUTO_REPROBE (periods between probes; 0: probe once).
  int64_t warmupSteps = -1;
  int64_t period = -1;
  int64_t reprobe = -1;
  int64_t probeSteps = 2;      // steps per candidate in a probe (>= 1)
  double slack = 0.02;         // accepted slowdown for wider wires (a fraction)
  double residualLimit = 1.0;  // residual / gradient (L1) that widens a bucket
};

struct ReducerOptions {
  ReduceOp op = ReduceOp::kAvg;
  // Bucket size in bytes; 0 takes GFLOW_FUSION_THRESHOLD.
  uint64_t fusionThreshold = 0;
  // Negotiated rounds (see above); negative takes GFLOW_CYCLE_TIME_MS, 0 is
  // off (fixed buckets).
  std::chrono::milliseconds cycleTime{-1};
  // Chrome trace file ("" takes GFLOW_TIMELINE; "%r" in the name becomes the
  // rank, without it only rank 0 writes).
  std::string timeline;
  // Names for errors and the timeline, one per tensor (optional).
  std::vector<std::string> names;
  // Mixed precision: float32 gradients travel as `wire` (kFloat16,
  // kBFloat16, or block-quantized kQInt8 / kQInt4); every hop adds in
  // float32 (AllreduceOptions). prescale and postscale apply with a
  // compressed wire (e.g. prescale 1/N with kSum). Unset: GFLOW_WIRE
  // (float32 unless set; "auto" is autoWire).
  std::optional<DataType> wire;
  AutoWireOptions autoWire;
  float prescale = 1.0f;
  float postscale = 1.0f;
  // With a quantized wire (and no CSC, whose unsent chunks are their own
  // feedback): the reducer keeps each float32 gradient's quantization
  // error and adds it to the next step's gradient (docs/compression.md).
  // Every rank must pass the same.
  bool errorFeedback = true;
  SparseOptions sparse;
  // Reproducible mode for the reducer's allreduces (Options::reproducible):
  // the averaged gradients' bits do not depend on fusionThreshold, the
  // cycle time or anything else that cuts them into buckets (with CSC,
  // which chunks travel is still picked per bucket). Unset: the
  // communicator's. Every rank must pass the same (kMismatch otherwise).
  std::optional<bool> reproducible;
};

struct ReducerStats {
  uint64_t steps = 0;     // completed wait()s
  uint64_t fusedOps = 0;  // allreduces issued (buckets or rounds' pieces)
  // Dense buckets only (CSC buckets count in sparseChunks):
  uint64_t packedBytes = 0;       // bytes copied into fusion buffers (and back out)
  uint64_t inPlaceBytes = 0;      // bytes reduced in place without a copy
  uint64_t controlOps = 0;        // negotiation allreduces (cycle-time mode)
  uint64_t sparseChunks = 0;      // CSC: chunks considered
  uint64_t sparseChunksSent = 0;  // CSC: chunks sent
  uint64_t wireChanges = 0;       // automatic wire: buckets whose wire changed
};

class GFLOW_EXPORT GradientReducer {
 public:
  // Collective over `comm`: every rank registers the same tensors (count and
  // dtype, in the same order). The tensors stay owned by the caller and must
  // outlive the reducer at the same addresses (the buckets, and which of
  // them are in place, are fixed here).
  GradientReducer(std::shared_ptr<Communicator> comm, std::vector<Tensor> gradients,
                  ReducerOptions options = ReducerOptions{});
  ~GradientReducer();
  GradientReducer(const GradientReducer&) = delete;
  GradientReducer& operator=(const GradientReducer&) = delete;

  // After the membership changed (Communicator::shrink or grow; docs/
  // elastic.md): the same reducer (tensors, options) on `comm`, collective
  // over `comm` as the constructor is (a joiner constructs its reducer
  // with the same tensors and options). This rank's error-feedback
  // residuals and CSC residual and velocity carry over; the step count
  // (CSC warm-up, the automatic wire's schedule and choices) starts again,
  // as a joiner's does, so every rank is at the same point. Call it
  // between steps: a step in the middle is abandoned (its error, if any,
  // was raised by wait()).
  void rebuild(std::shared_ptr<Communicator> comm);

  // Gradient `index` holds this step's value. Never blocks on communication.
  void ready(size_t index);
  // Waits until every gradient of this step is reduced in place; rethrows the
  // first error. A timeout of 0 waits until the op deadline (GFLOW_TIMEOUT).
  // The next ready() starts the next step.
  void wait(std::chrono::milliseconds timeout = std::chrono::milliseconds(0));

  size_t numTensors() const;
  // Fixed buckets: the tensor indices of each bucket, in firing order.
  std::vector<std::vector<size_t>> buckets() const;
  uint64_t fusionThreshold() const;
  ReducerStats stats() const;
  // After wait(): whether the step's reduced gradients held an inf or NaN
  // (checked with a compressed wire or CSC; every rank agrees). A loss
  // scaler skips the step and lowers its scale.
  bool nonFinite() const;
  // The wire each fixed bucket's float32 data takes in the next step (the
  // buckets() order; a bucket of another dtype travels as itself). Every
  // rank has the same.
  std::vector<DataType> wires() const;
  // The reducer's own communicator (for its Stats: bytes on the wire).
  const Communicator& communicator() const;

 private:
  class Impl;
  std::unique_ptr<Impl> impl_;
};

// The automatic wire for callers that issue each bucket's allreduce
// themselves (gflow.torch.auto_compress_hook): the measurements, agreement,
// decisions and guard of GradientReducer's (AutoWireOptions;
// docs/compression.md) over `buckets` float32 buckets. Per step, in bucket
// order: ready(b) as bucket b's allreduce is issued on wire(b) (with the
// caller's error-feedback residual on a quantized wire), done(b) when it
// has completed; then finishStep(). Calls must not race.
class GFLOW_EXPORT WireChooser {
 public:
  // Not collective; every rank must pass the same. `names` (optional)
  // label the buckets in the log and the timeline (`timeline`: a Chrome
  // trace file as ReducerOptions::timeline, "" none). Bad options:
  // kInvalidArgument.
  WireChooser(std::shared_ptr<Communicator> comm, size_t buckets, AutoWireOptions options = {},
              std::vector<std::string> names = {}, std::string timeline = "");
  ~WireChooser();
  WireChooser(const WireChooser&) = delete;
  WireChooser& operator=(const WireChooser&) = delete;

  DataType wire(size_t bucket) const;
  std::vector<DataType> wires() const;
  void ready(size_t bucket);
  void done(size_t bucket);
  // Once every bucket's allreduce of the step has completed, before the
  // next step's: collective on `comm` when an agreement is due (every rank
  // calls it at the same point among its ops on `comm`). `nonFinite`:
  // whether a result of the step held an inf or NaN (Work::nonFinite; the
  // same on every rank). `residualRatios`, called only when the guard needs
  // it: per bucket the L1 norm of its residual over its gradient's (0
  // where none). Returns the number of buckets whose wire changed.
  uint64_t finishStep(bool nonFinite,
                      const std::function<std::vector<double>()>& residualRatios = nullptr);
  uint64_t steps() const;

 private:
  class Impl;
  std::unique_ptr<Impl> impl_;
};

// One-shot coalesced allreduce for frameworks that bucket themselves: the
// tensors are packed into fusion buffers of up to `fusionThreshold` bytes
// (0: GFLOW_FUSION_THRESHOLD; one dtype per buffer; tensors of at least the
// threshold go in place), reduced and unpacked in place. Every rank passes
// the same list. The returned Work completes when all of them are done; the
// tensors must stay alive until then. It issues one allreduce per buffer on
// `comm`, like that many calls: calls from several threads must not race.
GFLOW_EXPORT Work allreduceCoalesced(Communicator& comm, const std::vector<Tensor>& tensors,
                                     ReduceOp op = ReduceOp::kSum, uint64_t fusionThreshold = 0);

}  // namespace gflow
