// WirePolicy: the decisions of the reducer's automatic wire
// (ReducerOptions::autoWire, docs/compression.md), apart from any
// communication, so every rank that feeds it the same agreed numbers picks
// the same wire for every bucket.
//
// A bucket's wire is a level into the candidates, widest (0) first. The
// schedule, in completed steps: plain warm-up on level 0; a probe, each
// candidate on every bucket for probeSteps steps; then periods of `period`
// steps. At the end of a probe or a period the owner agrees on window()
// with its peers (an elementwise max over ranks) and calls decide().
//
// After a probe: the probe measured every uniform choice's step time (one
// wire on every bucket: what a static setting would give); the fastest is
// the base. A per-bucket pick may beat it: the pick simulates one step
// (bucket b starts on the progress thread when it is ready and the bucket
// before it is done, and takes its measured cost on its wire; the step ends
// when the last bucket is done, or at wait() if that is later) and, from the
// fastest assignment, widens buckets one level at a time, in firing order,
// while the simulated step stays within `slack` of the fastest: what
// backward hides costs nothing, so early buckets stay wide. The simulation
// does not see everything (the cores that compute and communicate are
// shared), so a pick that differs from the base runs as a trial for as
// many steps as a probe stage: kept if its least step time is within
// `slack` of the base's, else the base is taken and that pick is not tried
// again. Then come periods of `period` steps. Every `reprobe`
// periods a probe starts the cycle again.
//
// Guard: an inf/NaN step (record) or a residual above residualLimit
// (decide) widens a lossy bucket by one level and caps it there; the cap
// lifts one level per decision after holdPeriods calm ones.
#pragma once

#include <cstddef>
#include <cstdint>
#include <string>
#include <vector>

#include "gflow/types.h"

namespace gflow::gradient {

struct WirePolicyConfig {
  std::vector<DataType> candidates;  // widest first, at least one
  uint64_t warmupSteps = 0;          // steps before the first probe ends its level-0 stage
  uint64_t probeSteps = 2;           // steps per candidate in a probe (>= 1)
  uint64_t period = 50;              // steps between decisions (>= 1)
  uint64_t reprobe = 0;              // decisions between probes (0: probe once)
  double slack = 0.02;
  double residualLimit = 1.0;
  uint64_t holdPeriods = 3;
};

// One rank's timings of one completed step, in seconds from the step's
// first ready(); one entry per bucket.
struct StepSample {
  std::vector<double> ready;  // when the bucket's last tensor was ready
  std::vector<double> cost;   // its op's run on the progress thread (< 0: none)
  double wait = 0;            // when wait() was called
  double step = -1;           // since the previous step ended (< 0: unknown)
};

struct WireChange {
  size_t bucket;
  DataType from, to;
  std::string reason;
};

class WirePolicy {
 public:
  // choosable[b]: bucket b holds float32 data (other buckets keep their
  // dtype, but their costs still take their place in the simulated step).
  WirePolicy(WirePolicyConfig config, std::vector<bool> choosable);

  DataType wire(size_t bucket) const { return config_.candidates[level_[bucket]]; }
  size_t numBuckets() const { return level_.size(); }

  // The step just completed (every rank agrees on nonFinite). Returns the
  // changes for the next step: the guard's, or the probe's next stage.
  std::vector<WireChange> record(const StepSample& sample, bool nonFinite);
  // After record(): the owner must now agree on window() and decide().
  bool agreementDue() const { return due_; }
  // This rank's measurements since the last decision, laid out for an
  // elementwise max over ranks (costs negated: the least a rank measured,
  // that is without waiting for a late peer). residualRatio[b]: L1 of the
  // bucket's residual over its gradient's (0: none).
  std::vector<double> window(const std::vector<double>& residualRatio) const;
  std::vector<WireChange> decide(const std::vector<double>& agreed);

  // The simulated end of a step (seconds from its first ready) with
  // `levels`, on the agreed costs.
  double simulate(const std::vector<size_t>& levels) const;

  // Everything decided and measured so far, as numbers
  // (wire_policy_state.cc), and back: restore() takes a state() of a policy
  // with the same buckets and candidates, else returns false and changes
  // nothing.
  std::vector<double> state() const;
  bool restore(const std::vector<double>& state);

 private:
  enum class Phase { kWarmup, kProbe, kTrial, kSettled };
  size_t numLevels() const { return config_.candidates.size(); }
  bool known(size_t b, size_t k) const;
  void setLevel(size_t b, size_t k, const std::string& reason, std::vector<WireChange>* out);
  void widen(size_t b, const std::string& reason, std::vector<WireChange>* out);
  void startProbeStage(size_t stage, std::vector<WireChange>* out);
  std::vector<size_t> pick() const;
  std::vector<size_t> uniform(size_t level) const;
  // decide()'s choice after a probe or a period in `phase`.
  std::string choose(Phase phase, double periodStep);
  void clearWindow();
  // state() and restore(): `io` visits every field of `p`, in one order.
  template <class Policy, class Io>
  static void fields(Policy& p, Io& io);
  bool consistent() const;  // restore(): sizes and levels in range

  WirePolicyConfig config_;
  std::vector<bool> choosable_;
  std::vector<size_t> level_;              // per bucket
  std::vector<size_t> cap_;                // per bucket: the narrowest level allowed
  std::vector<uint64_t> calm_;             // per bucket: decisions since its last trouble
  std::vector<std::vector<double>> cost_;  // [bucket][level], agreed; < 0: unknown
  std::vector<double> ready_;              // agreed
  double wait_ = 0;
  std::vector<double> stageStep_;  // per level: the probe's step time (< 0: unknown)
  size_t base_ = 0;                // the fastest uniform level
  std::vector<size_t> chosen_;     // per bucket: the decided level (before caps)
  std::vector<size_t> rejected_;   // the last pick whose trial failed
  Phase phase_ = Phase::kWarmup;
  size_t stage_ = 0;      // probe stage (= level being probed)
  uint64_t inPhase_ = 0;  // steps in this warm-up, stage or period
  uint64_t periods_ = 0;  // since the last probe
  bool due_ = false;
  // The window since the last decision.
  std::vector<std::vector<double>> windowCost_;  // min; < 0: none
  std::vector<double> windowReady_;
  double windowWait_ = 0;
  std::vector<double> windowStage_;  // per level: least step time on it, uniform
  double windowStep_ = -1;           // least step time
  uint64_t windowSteps_ = 0;
};

}  // namespace gflow::gradient
