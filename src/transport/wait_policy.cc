#include "transport/wait_policy.h"

#include <sched.h>
#include <unistd.h>

#include <algorithm>
#include <optional>

#include "common/params.h"

namespace gflow::transport {
namespace {

// The cpus this thread may run on (its affinity mask: taskset, a cgroup
// cpuset, a launcher's binding), else the online ones.
int usableCpus() {
  cpu_set_t set;
  CPU_ZERO(&set);
  if (sched_getaffinity(0, sizeof(set), &set) == 0) return std::max(1, CPU_COUNT(&set));
  return static_cast<int>(std::max(1L, sysconf(_SC_NPROCESSORS_ONLN)));
}

}  // namespace

WaitPolicy WaitPolicy::choose(const ContextOptions& o) {
  WaitPolicy p;
  if (o.progress.spinUs) {
    p.spin = std::chrono::microseconds(*o.progress.spinUs);
  } else if (const std::optional<int64_t> us = params::spinUs()) {
    p.spin = std::chrono::microseconds(*us);
  } else {
    const int ranks = std::max(1, o.ranksOnHost > 0 ? o.ranksOnHost : o.size);
    p.spin = ranks <= usableCpus() ? kFitSpin : kOversubscribedSpin;
  }
  return p;
}

void SpinPhase::relax() {
  sched_yield();
}

}  // namespace gflow::transport
