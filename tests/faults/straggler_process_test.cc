// Stragglers with every rank a process (fault_worker `straggle`): rank k
// sleeps a random 5-50 ms before each allreduce; every rank's Stats name k
// last in at least 95% of the ops, with its mean skew within 2 ms (plus the
// machine's wake-up latency, testing/wake_latency.h) of what
// the processes' own clocks measured (k's call minus the earliest call; one
// host, one steady clock), over shared memory and over TCP. Rank 0's
// stragglerSummary() says so. Runs alone (tests/CMakeLists.txt).
#include <gtest/gtest.h>

#include <map>
#include <regex>
#include <sstream>
#include <string>
#include <vector>

#include "faults/job.h"
#include "testing/wake_latency.h"

namespace {

using namespace gflow::faulttest;
using std::chrono::seconds;

constexpr int kRanks = 4;
constexpr int kIters = 30;

std::vector<uint64_t> numbers(const std::string& csv) {
  std::vector<uint64_t> out;
  std::stringstream ss(csv);
  for (std::string item; std::getline(ss, item, ',');) out.push_back(std::stoull(item));
  return out;
}

void checkLayout(const char* name, const std::map<std::string, std::string>& env, int slow) {
  Job job(
      kRanks,
      [&](int) {
        return std::vector<std::string>{"straggle", std::to_string(kIters), "16384",
                                        std::to_string(slow)};
      },
      seconds(60));
  for (const auto& [k, v] : env) job.setEnv(k, v);
  const double bound = 2e6 + 2.0 * static_cast<double>(gflow::testing::wakeLatencyNs());
  job.start();
  ASSERT_TRUE(job.waitExit(seconds(55))) << name << "\n" << job.report();
  static const std::regex kCalled("GFLOW_CALLED rank=(\\d+) iter=(\\d+) ns=(\\d+)");
  static const std::regex kCounts(
      "GFLOW_STRAGGLERS rank=\\d+ ops=(\\d+) last=([\\d,]+) late=([\\d,]+)");
  std::vector<std::vector<int64_t>> called(kRanks, std::vector<int64_t>(kIters + 1, 0));
  for (int r = 0; r < kRanks; ++r) {
    ASSERT_EQ(job.result(r).exitCode, 0) << name << "\n" << job.report();
    const std::string& out = job.result(r).out;
    for (auto it = std::sregex_iterator(out.begin(), out.end(), kCalled);
         it != std::sregex_iterator(); ++it) {
      called[r][std::stoul((*it)[2].str())] = std::stoll((*it)[3].str());
    }
  }
  double measured = 0;  // mean over the sleeping ops of k's call minus the earliest
  for (int i = 0; i < kIters; ++i) {
    int64_t earliest = called[0][i];
    for (int r = 1; r < kRanks; ++r) earliest = std::min(earliest, called[r][i]);
    measured += static_cast<double>(called[slow][i] - earliest) / kIters;
  }
  for (int r = 0; r < kRanks; ++r) {
    std::smatch m;
    const std::string& out = job.result(r).out;
    ASSERT_TRUE(std::regex_search(out, m, kCounts)) << name << "\n" << job.report();
    const std::vector<uint64_t> last = numbers(m[2].str()), late = numbers(m[3].str());
    ASSERT_EQ(last.size(), static_cast<size_t>(kRanks));
    // kIters sleeping ops and one more without (its straggler is anyone).
    EXPECT_GE(last[slow] * 100, 95u * kIters)
        << name << ": rank " << r << " named rank " << slow << " last in " << last[slow] << " ops";
    const double mean = static_cast<double>(late[slow]) / static_cast<double>(last[slow]);
    EXPECT_NEAR(mean, measured, bound) << name << ": rank " << r << "'s mean skew";
  }
  const std::string want = "rank " + std::to_string(slow) + " was last in";
  EXPECT_NE(job.result(0).out.find(want), std::string::npos) << name << "\n" << job.report();
}

TEST(StragglerTiming, ProcessesNameTheSleepingRank) {
  checkLayout("shm", {}, 2);
  checkLayout("tcp", {{"GFLOW_SHM", "0"}}, 1);
}

}  // namespace
