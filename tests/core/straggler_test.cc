// Stragglers (common/arrivals.h, docs/errors.md): every rank names the rank
// that reached each collective last, and by how much, from the stamps its
// messages carry and, within a host, the shared clock.
//
// The bookkeeping alone (Arrivals) against hand-made stamps; then 4 ranks as
// threads where rank k sleeps a random 5-50 ms before each allreduce: every
// rank names k in at least 95% of the ops, with the skew within 2 ms (plus
// the machine's wake-up latency) of what the test measured (k's call minus
// the earliest call), on every path
// (shared memory, TCP with ring / recursive doubling / the fixed order, two
// pretend hosts, verbs on the software device). Without a straggler no rank
// stands out. The StragglerTiming tests run alone (tests/CMakeLists.txt):
// other tests' threads on the same cores would blur the 2 ms.
#include <gtest/gtest.h>

#include <algorithm>
#include <chrono>
#include <cmath>
#include <optional>
#include <random>
#include <sstream>
#include <string>
#include <thread>
#include <vector>

#include "common/arrivals.h"
#include "common/tick_clock.h"
#include "core/internal.h"
#include "gflow/gflow.h"
#include "testing/ranks.h"
#include "testing/scoped_env.h"
#include "testing/soft_verbs.h"
#include "testing/wake_latency.h"

namespace gflow {
namespace {

constexpr int64_t kMs = 1000000;

// ns as Arrivals' clock counts them (TickClock ticks).
int64_t ticks(int64_t ns) {
  return TickClock::fromNs(ns);
}

// The test's own clock, independent of the library's.
int64_t steadyNs() {
  return std::chrono::duration_cast<std::chrono::nanoseconds>(
             std::chrono::steady_clock::now().time_since_epoch())
      .count();
}

// A stamp as `sender` would send it `elapsedNs` into an op in which it knows
// `latest` started `latestOffNs` after it and the earliest rank
// `firstOffNs` after it (<= 0), with `prev` its verdict on the op before.
ArrivalStamp stampOf(int64_t elapsedNs, int latest, int64_t latestOffNs, int64_t firstOffNs,
                     ArrivalVerdict prev = {}) {
  ArrivalStamp s;
  auto i32 = [](int64_t ns) { return static_cast<uint64_t>(static_cast<uint32_t>(ns / 1000)); };
  s.words[0] = static_cast<uint64_t>(elapsedNs / 1000) | static_cast<uint64_t>(latest) << 32 |
               uint64_t(1) << 63;
  s.words[1] = i32(latestOffNs) | i32(firstOffNs) << 32;
  if (prev.last >= 0) {
    s.words[2] = static_cast<uint64_t>(prev.last + 1) | static_cast<uint64_t>(prev.informed) << 31 |
                 static_cast<uint64_t>(prev.skewNs / 1000) << 32;
  }
  return s;
}

TEST(Arrivals, APeerHeardLateIsNamedWithItsDelay) {
  Arrivals a(0, 4, true);
  a.begin();
  const int64_t t = Arrivals::now();
  a.observe(1, t, stampOf(0, 1, 0, 0), true);                          // rank 1 started just now
  a.observe(2, t + ticks(30 * kMs), stampOf(0, 2, 0, 0), true);        // rank 2, 30 ms later
  a.observe(3, t + ticks(30 * kMs), stampOf(1 * kMs, 3, 0, 0), true);  // rank 3, 1 ms before rank 2
  a.end();
  const auto v = a.recent();
  ASSERT_EQ(v.size(), 1u);
  EXPECT_EQ(v[0].last, 2);
  EXPECT_NEAR(static_cast<double>(v[0].skewNs), 30.0 * kMs, 0.5 * kMs);
  const Arrivals::Totals tot = a.totals();
  EXPECT_EQ(tot.ops, 1u);
  EXPECT_EQ(tot.timesLast[2], 1u);
}

TEST(Arrivals, BacklogReadBeforeSettlingSaysOnlyNoLaterThanThisRank) {
  Arrivals a(3, 4, true);
  a.begin();
  // Stamped at their senders' starts, read only now: they may have waited.
  const int64_t later = Arrivals::now() + ticks(5 * kMs);
  for (int p = 0; p < 3; ++p) a.observe(p, later, stampOf(0, p, 0, 0), false);
  a.end();
  const auto v = a.recent();
  ASSERT_EQ(v.size(), 1u);
  EXPECT_EQ(v[0].last, 3) << "ties go to this rank";
  EXPECT_EQ(v[0].skewNs, 0);
}

TEST(Arrivals, RelayedKnowledgeNamesARankNeverHeardDirectly) {
  Arrivals a(0, 4, true);
  a.begin();
  const int64_t t = Arrivals::now();
  // Rank 1 started with this rank; 20 ms in it says rank 3 started 20 ms
  // after it and the earliest rank 1 ms before it.
  a.observe(1, t + ticks(20 * kMs), stampOf(20 * kMs, 3, 20 * kMs, -1 * kMs), true);
  a.end();
  const auto v = a.recent();
  EXPECT_EQ(v[0].last, 3);
  EXPECT_NEAR(static_cast<double>(v[0].skewNs), 21.0 * kMs, 0.5 * kMs);
}

TEST(Arrivals, ABetterVerdictOnThePreviousOpReplacesThisRanks) {
  Arrivals a(3, 4, true);
  a.begin();
  a.end();  // heard nobody: no verdict
  a.begin();
  const int64_t t = Arrivals::now();
  a.observe(0, t, stampOf(0, 0, 0, 0, ArrivalVerdict{3, 17 * kMs, true}), true);
  a.observe(1, t, stampOf(0, 1, 0, 0, ArrivalVerdict{2, 5 * kMs, true}), true);  // smaller: ignored
  a.observe(2, t, stampOf(0, 2, 0, 0, ArrivalVerdict{3, 19 * kMs, true}), true);   // larger: taken
  a.observe(0, t, stampOf(0, 0, 0, 0, ArrivalVerdict{1, 90 * kMs, false}), true);  // not measured
  a.end();
  const auto v = a.recent();
  ASSERT_EQ(v.size(), 2u);
  EXPECT_EQ(v[0].last, 3);
  EXPECT_EQ(v[0].skewNs, 19 * kMs);
  const Arrivals::Totals tot = a.totals();
  EXPECT_EQ(tot.timesLast[3], 1u + (v[1].last == 3 ? 1u : 0u));
  EXPECT_EQ(tot.ops, 2u);
  EXPECT_NE(a.summary(false).find("of 2 ops"), std::string::npos) << a.summary(false);
}

TEST(Arrivals, OffRecordsNothing) {
  Arrivals a(0, 4, false);
  a.begin();
  EXPECT_EQ(a.stamp().words[0], 0u);
  a.observe(1, Arrivals::now(), stampOf(0, 1, 0, 0), true);
  a.end();
  EXPECT_TRUE(a.recent().empty());
  EXPECT_EQ(a.summary(false), "");
}

// ---- ranks as threads ------------------------------------------------------

constexpr int kRanks = 4;
constexpr int kOps = 40;

struct Path {
  const char* name;
  Options options;
  int hosts = 1;
  bool verbs = false;
  size_t floats = 1024;  // 4 KiB
};

Options opts(const char* algo, bool shm, bool reproducible = false) {
  Options o;
  o.algorithm = algo;
  o.shm.enabled = shm;
  o.reproducible = reproducible;
  return o;
}

std::vector<Path> paths() {
  return {
      {"shm", opts("", true)},
      {"shm_1MiB", opts("", true), 1, false, 262144},
      {"tcp_ring", opts("ring", false)},
      {"tcp_rd", opts("rd", false)},
      {"tcp_fixed_order_1MiB", opts("", false, true), 1, false, 262144},
      {"two_hosts", opts("", true), 2},
      {"two_hosts_1MiB_segments", opts("", true), 2, false, 262144},  // phases overlap
      {"verbs", opts("", false), 1, true},
  };
}

struct Timings {
  std::vector<std::vector<int64_t>> called;           // [rank][op]: steady ns
  std::vector<std::vector<ArrivalVerdict>> verdicts;  // [rank][op]
};

// kOps allreduces on `p`, rank `slow` (-1: none) sleeping a random 5-50 ms
// before each; then one more without sleeping, so the last one's verdict is
// settled by the stamps of the next.
Timings runPath(const Path& p, int slow) {
  std::vector<int> hostOf(kRanks);
  for (int r = 0; r < kRanks; ++r) hostOf[r] = r * p.hosts / kRanks;
  std::optional<testing::softverbs::Installed> device;
  Options o = p.options;
  if (p.verbs) {
    device.emplace();
    o.transport = "verbs";
  }
  auto comms = testing::makeWorldWith(kRanks, testing::onHosts(hostOf, o));
  Timings run;
  run.called.assign(kRanks, std::vector<int64_t>(kOps));
  run.verdicts.resize(kRanks);
  testing::forEachRank(comms, [&](Communicator& c) {
    std::mt19937 rng(1234);
    std::uniform_int_distribution<int> sleepMs(5, 50);
    std::vector<float> v(p.floats, 1.0f);
    for (int i = 0; i < kOps; ++i) {
      const int ms = sleepMs(rng);  // drawn on every rank alike
      if (c.rank() == slow) std::this_thread::sleep_for(std::chrono::milliseconds(ms));
      run.called[c.rank()][i] = steadyNs();
      c.allreduce(tensor(v.data(), v.size()));
    }
    c.allreduce(tensor(v.data(), v.size()));
    auto all = internal::CommunicatorAccess::arrivalVerdicts(c);
    run.verdicts[c.rank()].assign(all.end() - kOps - 1, all.end() - 1);
  });
  return run;
}

// What is wrong with one run of `p` with `slow` sleeping, "" if nothing: the
// sleeper is named in 95% of the ops, with the measured delay within 2 ms
// (plus twice the machine's wake-up latency: wakeLatencyNs) in 90% of them.
// Not 95%: a thread preempted between the test's clock read and gflow's
// stamp (a loaded 2-core machine does that for milliseconds) adds the
// preemption to that op's skew, and under a concurrent build 3 of 40 ops
// missed by 2.1-2.3 ms.
std::string pathFailures(const Path& p, int slow) {
  const int64_t bound = 2 * kMs + 2 * testing::wakeLatencyNs();
  const Timings run = runPath(p, slow);
  std::ostringstream out;
  for (int r = 0; r < kRanks; ++r) {
    int named = 0;
    std::vector<int64_t> errors;
    std::string misses;
    for (int i = 0; i < kOps; ++i) {
      int64_t earliest = run.called[0][i];
      for (int q = 1; q < kRanks; ++q) earliest = std::min(earliest, run.called[q][i]);
      const int64_t skew = run.called[slow][i] - earliest;
      const ArrivalVerdict& v = run.verdicts[r][i];
      if (v.last == slow) {
        ++named;
        errors.push_back(std::llabs(v.skewNs - skew));
      }
      if ((v.last != slow || errors.back() > bound) && misses.size() < 600) {
        misses += " op " + std::to_string(i) + ": named " + std::to_string(v.last) + " by " +
                  std::to_string(v.skewNs / 1000) + " us (measured " + std::to_string(skew / 1000) +
                  " us);";
      }
    }
    const auto close =
        std::count_if(errors.begin(), errors.end(), [&](int64_t e) { return e <= bound; });
    if (named * 100 < 95 * kOps || close * 100 < 90 * kOps) {
      out << p.name << ": rank " << r << " named rank " << slow << " in " << named << " of " << kOps
          << " ops, within " << bound / 1000 << " us in " << close << ";" << misses << "\n";
    }
  }
  return out.str();
}

// A path passes if one of three runs does. A slow phase of this VM (seconds
// long, with a concurrent test on both cores) once preempted the sleeper for
// a 3-4 ms time slice between the test's clock read and gflow's stamp in 16
// consecutive ops; a wrong stamp or verdict fails every run alike.
TEST(StragglerTiming, TheSleepingRankIsNamedWithItsDelayOnEveryPath) {
  int slow = 0;
  for (const Path& p : paths()) {
    slow = (slow + 1) % kRanks;  // 1, 2, 3, 0, ...
    std::string failures;
    for (int attempt = 1; attempt <= 3; ++attempt) {
      const std::string f = pathFailures(p, slow);
      if (f.empty()) {
        failures.clear();
        break;
      }
      failures += "run " + std::to_string(attempt) + ":\n" + f;
    }
    EXPECT_EQ(failures, "") << p.name;
  }
}

TEST(StragglerTiming, StatsAndTheSummaryCountTheStraggler) {
  Path p{"shm", opts("", true)};
  std::vector<int> hostOf(kRanks, 0);
  auto comms = testing::makeWorldWith(kRanks, testing::onHosts(hostOf, p.options));
  std::vector<Stats> before(kRanks), after(kRanks);
  std::vector<std::string> summary(kRanks);
  testing::forEachRank(comms, [&](Communicator& c) {
    std::vector<float> v(1024, 1.0f);
    before[c.rank()] = c.stats();
    for (int i = 0; i < 20; ++i) {
      if (c.rank() == 2) std::this_thread::sleep_for(std::chrono::milliseconds(10));
      c.allreduce(tensor(v.data(), v.size()));
    }
    after[c.rank()] = c.stats();
    summary[c.rank()] = c.stragglerSummary();
  });
  for (int r = 0; r < kRanks; ++r) {
    EXPECT_GE(after[r].arrivalOps - before[r].arrivalOps, 20u);
    const uint64_t times = after[r].peers[2].timesLast - before[r].peers[2].timesLast;
    const uint64_t late = after[r].peers[2].lateNs - before[r].peers[2].lateNs;
    EXPECT_GE(times, 19u) << "rank " << r;
    EXPECT_NEAR(static_cast<double>(late) / static_cast<double>(times), 10.0 * kMs, 3.0 * kMs)
        << "rank " << r;
    EXPECT_NE(summary[r].find("rank 2 was last in"), std::string::npos) << summary[r];
  }
}

TEST(StragglerTiming, WithoutAStragglerNoRankStandsOut) {
  for (const Path& p : {paths()[0], paths()[2]}) {
    const Timings run = runPath(p, -1);
    for (int r = 0; r < kRanks; ++r) {
      std::vector<int> count(kRanks, 0);
      std::vector<int64_t> skews;
      for (const ArrivalVerdict& v : run.verdicts[r]) {
        if (v.last < 0) continue;
        ++count[v.last];
        skews.push_back(v.skewNs);
      }
      ASSERT_FALSE(skews.empty()) << p.name;
      std::sort(skews.begin(), skews.end());
      EXPECT_LT(*std::max_element(count.begin(), count.end()) * 100, 95 * kOps)
          << p.name << ": rank " << r << " names one rank in nearly every op";
      EXPECT_LT(skews[skews.size() / 2], 2 * kMs) << p.name << ": rank " << r;
    }
  }
}

// GFLOW_STRAGGLER_REPORT: rank 0 prints a summary of the ops since the last
// one, and the whole run's when the communicator ends; the others print none.
TEST(Stragglers, RankZeroReportsPeriodicallyAndAtTheEnd) {
  testing::ScopedEnv every("GFLOW_STRAGGLER_REPORT", "1ms");
  ::testing::internal::CaptureStderr();
  {
    auto comms = testing::makeWorld(2, opts("", true));
    testing::forEachRank(comms, [&](Communicator& c) {
      std::vector<float> v(64, 1.0f);
      for (int i = 0; i < 6; ++i) {
        if (c.rank() == 1) std::this_thread::sleep_for(std::chrono::milliseconds(10));
        c.allreduce(tensor(v.data(), v.size()));
      }
    });
  }
  const std::string err = ::testing::internal::GetCapturedStderr();
  EXPECT_NE(err.find("gflow straggler report (2 ranks, last "), std::string::npos) << err;
  EXPECT_NE(err.find("): rank 1 was last in 100% of 1 ops, median skew "), std::string::npos)
      << err;
  EXPECT_NE(err.find("gflow straggler summary (2 ranks): rank 1 was last in"), std::string::npos)
      << err;
  // Rank 0 only.
  const std::string summary = "gflow straggler summary";
  EXPECT_EQ(err.find(summary), err.rfind(summary)) << err;
}

TEST(Stragglers, OffMeansNoVerdicts) {
  Options o = opts("", true);
  o.shm.enabled = false;
  std::vector<std::string> summary(kRanks);
  std::vector<Stats> stats(kRanks);
  {
    testing::ScopedEnv off("GFLOW_STRAGGLER", "0");
    auto comms = testing::makeWorld(kRanks, o);
    testing::forEachRank(comms, [&](Communicator& c) {
      std::vector<float> v(1024, 1.0f);
      for (int i = 0; i < 5; ++i) c.allreduce(tensor(v.data(), v.size()));
      stats[c.rank()] = c.stats();
      summary[c.rank()] = c.stragglerSummary();
    });
  }
  for (int r = 0; r < kRanks; ++r) {
    EXPECT_EQ(stats[r].arrivalOps, 0u);
    EXPECT_EQ(summary[r], "");
  }
}

}  // namespace
}  // namespace gflow
