// WirePolicy's state as numbers (WirePolicy::state and restore): what the
// automatic wire carries across GradientReducer::rebuild, and what rank 0
// hands every other rank then, a joiner included, so that all go on from
// one state (docs/elastic.md). One field list serves both directions.
#include <algorithm>
#include <cmath>
#include <type_traits>

#include "gradient/wire_policy.h"

namespace gflow::gradient {

namespace {

constexpr double kFormat = 1;  // the layout's version, first in the state

// Appends each field.
struct Writer {
  std::vector<double>& out;
  void operator()(double v) { out.push_back(v); }
  void operator()(uint64_t v) { out.push_back(static_cast<double>(v)); }
  void operator()(bool v) { out.push_back(v ? 1 : 0); }
  template <class E, std::enable_if_t<std::is_enum_v<E>, int> = 0>
  void operator()(E e) {
    (*this)(static_cast<uint64_t>(e));
  }
  template <class T>
  void operator()(const std::vector<T>& v) {
    (*this)(static_cast<uint64_t>(v.size()));
    for (const T& x : v) (*this)(x);
  }
};

// Reads each field back; any value out of its type's range (a double that
// is not finite), or a state too short, clears ok (the fields then hold whatever was read).
struct Reader {
  const std::vector<double>& in;
  size_t at = 0;
  bool ok = true;
  double next() {
    if (at < in.size()) return in[at++];
    ok = false;
    return 0;
  }
  void operator()(double& v) {
    v = next();
    ok = ok && std::isfinite(v);
  }
  void operator()(uint64_t& v) {
    const double d = next();
    ok = ok && d >= 0 && d <= 9007199254740992.0 && d == static_cast<double>(uint64_t(d));
    v = ok ? static_cast<uint64_t>(d) : 0;
  }
  void operator()(bool& v) {
    uint64_t u = 0;
    (*this)(u);
    ok = ok && u <= 1;
    v = u == 1;
  }
  template <class E, std::enable_if_t<std::is_enum_v<E>, int> = 0>
  void operator()(E& e) {
    uint64_t u = 0;
    (*this)(u);
    ok = ok && u <= 255;
    e = static_cast<E>(u);
  }
  template <class T>
  void operator()(std::vector<T>& v) {
    uint64_t n = 0;
    (*this)(n);
    ok = ok && n <= in.size() - std::min(at, in.size());  // each element takes one number at least
    v.assign(ok ? n : 0, T{});
    for (T& x : v) (*this)(x);
  }
};

bool sized(const std::vector<std::vector<double>>& m, size_t rows, size_t cols) {
  return m.size() == rows &&
         std::all_of(m.begin(), m.end(), [&](const auto& r) { return r.size() == cols; });
}

}  // namespace

template <class Policy, class Io>
void WirePolicy::fields(Policy& p, Io& io) {
  io(p.level_);
  io(p.cap_);
  io(p.calm_);
  io(p.cost_);
  io(p.ready_);
  io(p.wait_);
  io(p.stageStep_);
  io(p.base_);
  io(p.chosen_);
  io(p.rejected_);
  io(p.phase_);
  io(p.stage_);
  io(p.inPhase_);
  io(p.periods_);
  io(p.due_);
  io(p.windowCost_);
  io(p.windowReady_);
  io(p.windowWait_);
  io(p.windowStage_);
  io(p.windowStep_);
  io(p.windowSteps_);
}

std::vector<double> WirePolicy::state() const {
  std::vector<double> out{kFormat, static_cast<double>(level_.size()),
                          static_cast<double>(numLevels())};
  Writer w{out};
  fields(*this, w);
  return out;
}

bool WirePolicy::restore(const std::vector<double>& state) {
  if (state.size() < 3 || state[0] != kFormat || state[1] != double(level_.size()) ||
      state[2] != double(numLevels())) {
    return false;
  }
  WirePolicy next = *this;
  Reader r{state, 3};
  fields(next, r);
  if (!r.ok || r.at != state.size() || !next.consistent()) return false;
  *this = std::move(next);
  return true;
}

bool WirePolicy::consistent() const {
  const size_t n = choosable_.size(), levels = numLevels();
  const auto isLevel = [&](uint64_t k) { return k < levels; };
  const auto allLevels = [&](const std::vector<uint64_t>& v) {
    return std::all_of(v.begin(), v.end(), isLevel);
  };
  return level_.size() == n && cap_.size() == n && calm_.size() == n && ready_.size() == n &&
         chosen_.size() == n && (rejected_.empty() || rejected_.size() == n) &&
         sized(cost_, n, levels) && sized(windowCost_, n, levels) && windowReady_.size() == n &&
         stageStep_.size() == levels && windowStage_.size() == levels && allLevels(level_) &&
         allLevels(cap_) && allLevels(chosen_) && allLevels(rejected_) && isLevel(base_) &&
         isLevel(stage_) && static_cast<int>(phase_) <= static_cast<int>(Phase::kSettled);
}

}  // namespace gflow::gradient
