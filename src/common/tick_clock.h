// TickClock: timestamps that cost a few ns, for bookkeeping on every op (the
// straggler record, common/arrivals.h).
//
// On x86-64 with an invariant TSC (CPUID 0x80000007 EDX bit 8: constant rate,
// running in every power state), a tick is one TSC count: about 11 ns to read
// on this project's VMs, against 25 ns for steady_clock (the kernel's
// clocksource through the vDSO). Elsewhere, a tick is steady_clock's ns.
//
// Ticks are compared only between threads and processes of one host: the
// TSC is one counter per host (the kernel synchronises the cores' counters
// at boot), so two processes' ticks agree exactly. The rate is measured
// once per process against steady_clock (about 2 ms, on first use); it
// converts tick differences, never absolute ticks, so the processes' small
// disagreement on it (typically parts in 10^5, at worst about 10^-3 when the
// clock reads are slow) errs by that fraction of a duration.
#pragma once

#include <cstdint>

namespace gflow {

class TickClock {
 public:
  static int64_t now() {
#if defined(__x86_64__)
    if (tsc()) return static_cast<int64_t>(__builtin_ia32_rdtsc());
#endif
    return steadyNs();
  }
  // A difference of ticks in ns, and back.
  static int64_t toNs(int64_t ticks) {
    return tsc() ? static_cast<int64_t>(static_cast<double>(ticks) * nsPerTick()) : ticks;
  }
  static int64_t fromNs(int64_t ns) {
    return tsc() ? static_cast<int64_t>(static_cast<double>(ns) / nsPerTick()) : ns;
  }
  // Whether ticks are the TSC's (else steady_clock's ns).
  static bool tsc() {
    static const bool t = invariantTsc();
    return t;
  }

 private:
  static double nsPerTick() {
    static const double r = tsc() ? measureNsPerTick() : 1.0;
    return r;
  }
  static bool invariantTsc();
  static double measureNsPerTick();
  static int64_t steadyNs();
};

}  // namespace gflow
