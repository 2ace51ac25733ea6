#include "gradient/wire_policy.h"

#include <algorithm>
#include <cmath>
#include <cstdio>

namespace gflow::gradient {

namespace {
// window(): a cost nobody measured (negated costs are <= 0 otherwise).
constexpr double kNone = -1e300;

std::string fixed(double v) {
  char text[32];
  std::snprintf(text, sizeof text, "%.3g", v);
  return text;
}
}  // namespace

WirePolicy::WirePolicy(WirePolicyConfig config, std::vector<bool> choosable)
    : config_(std::move(config)), choosable_(std::move(choosable)) {
  const size_t n = choosable_.size();
  level_.assign(n, 0);
  cap_.assign(n, numLevels() - 1);
  calm_.assign(n, 0);
  cost_.assign(n, std::vector<double>(numLevels(), -1));
  ready_.assign(n, 0);
  stageStep_.assign(numLevels(), -1);
  chosen_.assign(n, 0);
  config_.probeSteps = std::max<uint64_t>(config_.probeSteps, 1);
  config_.period = std::max<uint64_t>(config_.period, 1);
  clearWindow();
  // The warm-up's last probeSteps steps are the probe's level-0 stage.
  if (config_.warmupSteps <= config_.probeSteps) {
    std::vector<WireChange> none;
    startProbeStage(0, &none);
  }
}

bool WirePolicy::known(size_t b, size_t k) const {
  return cost_[b][k] >= 0;
}

void WirePolicy::clearWindow() {
  windowCost_.assign(level_.size(), std::vector<double>(numLevels(), -1));
  windowReady_.assign(level_.size(), 0);
  windowWait_ = 0;
  windowSteps_ = 0;
  windowStage_.assign(numLevels(), -1);
  windowStep_ = -1;
}

namespace {
void keepLeast(double& slot, double v) {
  if (v >= 0) slot = slot < 0 ? v : std::min(slot, v);
}
}  // namespace

void WirePolicy::setLevel(size_t b, size_t k, const std::string& reason,
                          std::vector<WireChange>* out) {
  if (!choosable_[b] || level_[b] == k) return;
  out->push_back({b, wire(b), config_.candidates[k], reason});
  level_[b] = k;
}

void WirePolicy::widen(size_t b, const std::string& reason, std::vector<WireChange>* out) {
  if (!choosable_[b] || level_[b] == 0) return;
  cap_[b] = level_[b] - 1;
  calm_[b] = 0;
  setLevel(b, cap_[b], reason, out);
}

void WirePolicy::startProbeStage(size_t stage, std::vector<WireChange>* out) {
  phase_ = Phase::kProbe;
  stage_ = stage;
  inPhase_ = 0;
  for (size_t b = 0; b < level_.size(); ++b) {
    setLevel(b, std::min(stage, cap_[b]), "probe", out);
  }
}

std::vector<WireChange> WirePolicy::record(const StepSample& s, bool nonFinite) {
  std::vector<WireChange> changes;
  if (phase_ != Phase::kWarmup) {
    for (size_t b = 0; b < level_.size(); ++b) {
      windowReady_[b] += s.ready[b];
      keepLeast(windowCost_[b][level_[b]], s.cost[b]);  // < 0: its op did not finish
    }
    windowWait_ += s.wait;
    ++windowSteps_;
    keepLeast(phase_ == Phase::kProbe ? windowStage_[stage_] : windowStep_, s.step);
  }
  if (nonFinite) {
    for (size_t b = 0; b < level_.size(); ++b) widen(b, "inf/NaN in the result", &changes);
  }
  ++inPhase_;
  switch (phase_) {
    case Phase::kWarmup:
      if (inPhase_ + config_.probeSteps >= config_.warmupSteps) startProbeStage(0, &changes);
      break;
    case Phase::kProbe:
      if (inPhase_ < config_.probeSteps) break;
      if (stage_ + 1 < numLevels()) {
        startProbeStage(stage_ + 1, &changes);
      } else {
        due_ = true;
      }
      break;
    case Phase::kTrial: due_ = inPhase_ >= config_.probeSteps; break;  // as long as a stage
    case Phase::kSettled: due_ = inPhase_ >= config_.period; break;
  }
  return changes;
}

std::vector<double> WirePolicy::window(const std::vector<double>& residualRatio) const {
  const size_t n = level_.size(), k = numLevels();
  std::vector<double> v;
  v.reserve(n * k + 2 * n + k + 2);
  for (size_t b = 0; b < n; ++b) {
    for (size_t l = 0; l < k; ++l) {
      v.push_back(windowCost_[b][l] < 0 ? kNone : -windowCost_[b][l]);
    }
  }
  const double steps = std::max<double>(windowSteps_, 1);
  for (size_t b = 0; b < n; ++b) v.push_back(windowReady_[b] / steps);
  v.push_back(windowWait_ / steps);
  for (size_t b = 0; b < n; ++b) v.push_back(b < residualRatio.size() ? residualRatio[b] : 0);
  for (size_t l = 0; l < k; ++l) v.push_back(windowStage_[l] < 0 ? kNone : windowStage_[l]);
  v.push_back(windowStep_ < 0 ? kNone : windowStep_);
  return v;
}

double WirePolicy::simulate(const std::vector<size_t>& levels) const {
  double t = 0;
  for (size_t b = 0; b < levels.size(); ++b) {
    const double c = cost_[b][levels[b]];
    t = std::max(t, ready_[b]) + std::max(c, 0.0);
  }
  return std::max(t, wait_);
}

std::vector<size_t> WirePolicy::uniform(size_t level) const {
  std::vector<size_t> out(level_.size(), 0);
  for (size_t b = 0; b < out.size(); ++b) out[b] = choosable_[b] ? std::min(level, cap_[b]) : 0;
  return out;
}

std::vector<size_t> WirePolicy::pick() const {
  // Per bucket the cheapest level it may take (ties: the wider).
  std::vector<size_t> levels = uniform(0);
  for (size_t b = 0; b < levels.size(); ++b) {
    if (!choosable_[b]) continue;
    for (size_t k = 0; k <= cap_[b]; ++k) {
      if (known(b, k) && (!known(b, levels[b]) || cost_[b][k] < cost_[b][levels[b]])) {
        levels[b] = k;
      }
    }
  }
  const double budget = simulate(levels) * (1 + config_.slack);
  // Widen one level at a time, early buckets first, while the step fits.
  for (bool changed = true; changed;) {
    changed = false;
    for (size_t b = 0; b < levels.size(); ++b) {
      if (!choosable_[b]) continue;
      size_t wider = levels[b];  // the next wider level with a known cost
      while (wider > 0 && !known(b, wider - 1)) --wider;
      if (wider == 0) continue;
      const size_t was = levels[b];
      levels[b] = wider - 1;
      if (simulate(levels) <= budget) {
        changed = true;
      } else {
        levels[b] = was;
      }
    }
  }
  return levels;
}

std::string WirePolicy::choose(Phase phase, double periodStep) {
  const std::string ms = " ms";
  auto stageMs = [&](size_t l) { return fixed(stageStep_[l] * 1e3) + ms; };
  if (phase == Phase::kProbe) {
    base_ = 0;
    for (size_t l = 1; l < numLevels(); ++l) {
      if (stageStep_[l] >= 0 && (stageStep_[base_] < 0 || stageStep_[l] < stageStep_[base_])) {
        base_ = l;
      }
    }
    const std::string why = "fastest uniform wire (" +
                            std::string(toString(config_.candidates[base_])) + ", step " +
                            stageMs(base_) + ")";
    const std::vector<size_t> p = pick();
    if (stageStep_[base_] < 0) {  // no step times: the simulation alone
      chosen_ = p;
      phase_ = Phase::kSettled;
      return "simulated step " + fixed(simulate(p) * 1e3) + ms;
    }
    if (p == uniform(base_) || p == rejected_) {
      chosen_ = uniform(base_);
      phase_ = Phase::kSettled;
      return why;
    }
    chosen_ = p;
    phase_ = Phase::kTrial;
    return "trial of a per-bucket pick (simulated step " + fixed(simulate(p) * 1e3) + ms +
           ") against the " + why;
  }
  if (phase == Phase::kTrial) {
    phase_ = Phase::kSettled;
    if (periodStep >= 0 && periodStep > stageStep_[base_] * (1 + config_.slack)) {
      rejected_ = chosen_;
      chosen_ = uniform(base_);
      return "the per-bucket pick's step (" + fixed(periodStep * 1e3) + ms +
             ") is slower than the uniform " + toString(config_.candidates[base_]) + "'s (" +
             stageMs(base_) + ")";
    }
  }
  return "cap lifted";
}

std::vector<WireChange> WirePolicy::decide(const std::vector<double>& agreed) {
  const size_t n = level_.size(), k = numLevels();
  std::vector<WireChange> changes;
  due_ = false;
  for (size_t b = 0; b < n; ++b) {
    for (size_t l = 0; l < k; ++l) {
      const double v = agreed[b * k + l];
      if (v > kNone / 2) cost_[b][l] = -v;
    }
    ready_[b] = agreed[n * k + b];
  }
  wait_ = agreed[n * k + n];
  const size_t at = n * k + 2 * n + 1;  // the step times
  for (size_t l = 0; l < k && phase_ == Phase::kProbe; ++l) {
    stageStep_[l] = agreed[at + l] > kNone / 2 ? agreed[at + l] : -1;
  }
  const double periodStep = agreed[at + k] > kNone / 2 ? agreed[at + k] : -1;
  // The guard first: a residual that outgrew its gradient widens the bucket.
  for (size_t b = 0; b < n; ++b) {
    const double ratio = agreed[n * k + n + 1 + b];
    if (choosable_[b] && isQuantized(wire(b)) && ratio > config_.residualLimit) {
      widen(b, "residual " + fixed(ratio) + " x the gradient (L1)", &changes);
    } else if (++calm_[b] > config_.holdPeriods && cap_[b] + 1 < k) {
      ++cap_[b];
    }
  }
  clearWindow();
  const Phase was = phase_;
  periods_ = was == Phase::kProbe ? 0 : periods_ + 1;
  if (config_.reprobe > 0 && periods_ >= config_.reprobe) {
    startProbeStage(0, &changes);
    return changes;
  }
  const std::string why = choose(was, periodStep);
  inPhase_ = 0;
  for (size_t b = 0; b < n; ++b) setLevel(b, std::min(chosen_[b], cap_[b]), why, &changes);
  return changes;
}

}  // namespace gflow::gradient
