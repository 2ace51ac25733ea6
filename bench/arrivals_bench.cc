// What the straggler bookkeeping costs a collective on its own
// (common/arrivals.h, docs/performance.md "Straggler bookkeeping"):
//
//   arrivals_bench
//
// BM_op/<peers>: one op as the shared-memory path runs it: begin, this
//   rank's view, the views of `peers` members, end.
// BM_stampAndObserve: one message each way: a stamp made, one observed.
// BM_clock: the clock read every op starts with (TickClock);
//   BM_steadyClock: steady_clock, which it replaced.
#include <benchmark/benchmark.h>

#include <chrono>

#include "common/arrivals.h"

namespace {

using gflow::Arrivals;

void BM_op(benchmark::State& state) {
  const int peers = static_cast<int>(state.range(0));
  Arrivals a(0, peers + 1, true);
  Arrivals::View v;
  v.entry = v.latestAt = v.firstAt = Arrivals::now();
  for (auto _ : state) {
    a.begin();
    benchmark::DoNotOptimize(a.view());
    for (int m = 1; m <= peers; ++m) {
      v.latest = m;
      a.merge(m, v);
    }
    a.end();
  }
}
BENCHMARK(BM_op)->Arg(1)->Arg(3)->Arg(7);

void BM_stampAndObserve(benchmark::State& state) {
  Arrivals a(0, 4, true);
  a.begin();
  for (auto _ : state) {
    const gflow::ArrivalStamp s = a.stamp();
    a.observe(1, Arrivals::now(), s, true);
    benchmark::DoNotOptimize(s);
  }
  a.end();
}
BENCHMARK(BM_stampAndObserve);

void BM_clock(benchmark::State& state) {
  for (auto _ : state) benchmark::DoNotOptimize(Arrivals::now());
}
BENCHMARK(BM_clock);

void BM_steadyClock(benchmark::State& state) {
  for (auto _ : state) benchmark::DoNotOptimize(std::chrono::steady_clock::now());
}
BENCHMARK(BM_steadyClock);

}  // namespace
