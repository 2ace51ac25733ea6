#include "transport/liveness.h"

#include <algorithm>

namespace gflow::transport {

LivenessProbe::LivenessProbe(std::chrono::milliseconds contextTimeout)
    : grace_(std::clamp<int64_t>(contextTimeout.count() / 4, 50, 2000)) {}

LivenessProbe::Step LivenessProbe::step(const Deadline& deadline, uint64_t pongs) {
  if (!probing_) {
    if (!deadline.expired()) return Step::kWait;
    probing_ = true;
    pongsBefore_ = pongs;
    end_ = Deadline::after(grace_);
    return Step::kPing;
  }
  if (!end_.expired()) return Step::kWait;
  alive_ = pongs > pongsBefore_;
  if (!alive_ || end_.at() - deadline.at() >= 3 * grace_) return Step::kTimeout;
  end_ = Deadline::after(2 * grace_);  // alive: wait for the culprit's report
  return Step::kWait;
}

int LivenessProbe::sleepMs(const Deadline& deadline, int capMs) const {
  const int halfGrace = static_cast<int>(grace_.count() / 2);
  return std::min({probing_ ? end_.remainingMs() : deadline.remainingMs(), capMs, halfGrace});
}

}  // namespace gflow::transport
