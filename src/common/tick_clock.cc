#include "common/tick_clock.h"

#include <chrono>
#include <cstdint>

#if defined(__x86_64__)
#include <cpuid.h>
#endif

namespace gflow {
namespace {

// ns per tick: the TSC's advance over about 2 ms of steady_clock. Each end
// is the narrowest of 16 steady_clock reads, each between two TSC reads, so
// that a preemption or a slow read there does not skew it.
double measureRate() {
#if defined(__x86_64__)
  auto pair = [](int64_t& ns, int64_t& ticks) {
    int64_t width = INT64_MAX;
    for (int i = 0; i < 16; ++i) {
      const auto t0 = static_cast<int64_t>(__builtin_ia32_rdtsc());
      const int64_t s = std::chrono::duration_cast<std::chrono::nanoseconds>(
                            std::chrono::steady_clock::now().time_since_epoch())
                            .count();
      const auto t1 = static_cast<int64_t>(__builtin_ia32_rdtsc());
      if (t1 - t0 < width) {
        width = t1 - t0;
        ns = s;
        ticks = t0 + (t1 - t0) / 2;
      }
    }
  };
  int64_t ns0 = 0, ticks0 = 0, ns1 = 0, ticks1 = 0;
  pair(ns0, ticks0);
  do pair(ns1, ticks1);
  while (ns1 - ns0 < 2000000);
  return static_cast<double>(ns1 - ns0) / static_cast<double>(ticks1 - ticks0);
#else
  return 1.0;
#endif
}

}  // namespace

bool TickClock::invariantTsc() {
#if defined(__x86_64__)
  unsigned a = 0, b = 0, c = 0, d = 0;
  if (static_cast<unsigned>(__get_cpuid_max(0x80000000u, nullptr)) < 0x80000007u) return false;
  __cpuid(0x80000007u, a, b, c, d);
  return (d & (1u << 8)) != 0;
#else
  return false;
#endif
}

double TickClock::measureNsPerTick() {
  return measureRate();
}

int64_t TickClock::steadyNs() {
  return std::chrono::duration_cast<std::chrono::nanoseconds>(
             std::chrono::steady_clock::now().time_since_epoch())
      .count();
}

}  // namespace gflow
