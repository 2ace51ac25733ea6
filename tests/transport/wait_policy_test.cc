// The waiting policy: how long a waiting rank polls before it sleeps, from
// whether the host's ranks fit the cpus this thread may run on.
#include <gtest/gtest.h>
#include <sched.h>

#include <chrono>
#include <thread>

#include "testing/scoped_env.h"
#include "transport/wait_policy.h"

namespace gflow {
namespace {

using std::chrono::microseconds;
using transport::ContextOptions;
using transport::WaitPolicy;

int cpusOfThisThread() {
  cpu_set_t set;
  CPU_ZERO(&set);
  EXPECT_EQ(sched_getaffinity(0, sizeof(set), &set), 0);
  return CPU_COUNT(&set);
}

// The policy of `o` on a thread bound to one cpu (a launcher's binding).
WaitPolicy onOneCpu(const ContextOptions& o) {
  WaitPolicy p;
  std::thread t([&] {
    cpu_set_t one;
    CPU_ZERO(&one);
    CPU_SET(sched_getcpu(), &one);
    ASSERT_EQ(sched_setaffinity(0, sizeof(one), &one), 0);
    p = WaitPolicy::choose(o);
  });
  t.join();
  return p;
}

TEST(WaitPolicy, RanksThatFitTheCpusPoll) {
  testing::ScopedEnv spin("GFLOW_SPIN_US", "auto");
  ContextOptions o;
  o.size = 64;
  o.ranksOnHost = cpusOfThisThread();
  EXPECT_EQ(WaitPolicy::choose(o).spin, WaitPolicy::kFitSpin);
}

TEST(WaitPolicy, MoreRanksThanCpusDoNotPollLong) {
  testing::ScopedEnv spin("GFLOW_SPIN_US", "auto");
  ContextOptions o;
  o.size = 2;
  o.ranksOnHost = cpusOfThisThread() + 1;
  EXPECT_EQ(WaitPolicy::choose(o).spin, WaitPolicy::kOversubscribedSpin);
  EXPECT_LT(WaitPolicy::kOversubscribedSpin, WaitPolicy::kFitSpin);
}

// The affinity mask counts, not the machine: two ranks bound to one cpu
// are oversubscribed on any host.
TEST(WaitPolicy, TheAffinityMaskDecides) {
  testing::ScopedEnv spin("GFLOW_SPIN_US", "auto");
  ContextOptions o;
  o.size = 2;
  o.ranksOnHost = 1;
  EXPECT_EQ(onOneCpu(o).spin, WaitPolicy::kFitSpin);
  o.ranksOnHost = 2;
  EXPECT_EQ(onOneCpu(o).spin, WaitPolicy::kOversubscribedSpin);
}

// Without the host's count, the context's own size stands in for it.
TEST(WaitPolicy, UnknownRanksOnHostTakesTheContextSize) {
  testing::ScopedEnv spin("GFLOW_SPIN_US", "auto");
  ContextOptions o;
  o.ranksOnHost = -1;
  o.size = 1;
  EXPECT_EQ(onOneCpu(o).spin, WaitPolicy::kFitSpin);
  o.size = 3;
  EXPECT_EQ(onOneCpu(o).spin, WaitPolicy::kOversubscribedSpin);
}

TEST(WaitPolicy, ExplicitBudgetsWinOverTheChoice) {
  ContextOptions o;
  o.size = 1;
  {
    testing::ScopedEnv spin("GFLOW_SPIN_US", "0");
    EXPECT_EQ(WaitPolicy::choose(o).spin, microseconds(0));
    o.progress.spinUs = 25;
    EXPECT_EQ(WaitPolicy::choose(o).spin, microseconds(25));
  }
  o.progress.spinUs.reset();
  o.size = 1000;
  testing::ScopedEnv spin("GFLOW_SPIN_US", "300");
  EXPECT_EQ(WaitPolicy::choose(o).spin, microseconds(300));
}

TEST(WaitPolicy, APhaseWithoutBudgetNeverPolls) {
  WaitPolicy none;
  EXPECT_FALSE(transport::SpinPhase(none).polling());
  WaitPolicy some;
  some.spin = std::chrono::seconds(10);
  EXPECT_TRUE(transport::SpinPhase(some).polling());
}

}  // namespace
}  // namespace gflow
