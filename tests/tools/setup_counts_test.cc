// What setting up a job costs, as allreduce_bw's "# setup" line reports it
// (Stats::Resources, maxima over the ranks), for jobs of processes started
// by gflowrun: with GFLOW_CONNECT=all every rank connected to every other,
// with connections on demand only to the peers its ops use; and the store
// requests O(N), not O(N^2): a rank publishes its address and reads all
// addresses in one multi-get, and the shared-memory group reads its
// members' segments the same way.
#include <gtest/gtest.h>

#include <cstdio>
#include <cstdlib>
#include <map>
#include <sstream>
#include <string>

namespace {

#if defined(GFLOW_TEST_GFLOWRUN) && defined(GFLOW_TEST_ALLREDUCE_BW)

// The key=value pairs of the "# setup" line of an n-rank allreduce_bw run
// (empty when there is none); `env`: assignments before the command.
std::map<std::string, double> setupOf(int n, const std::string& env) {
  const std::string cmd = env + " " + GFLOW_TEST_GFLOWRUN + " -n " + std::to_string(n) + " " +
                          GFLOW_TEST_ALLREDUCE_BW + " -b 4K -e 4K -n 2 -w 1 2>&1";
  std::map<std::string, double> out;
  FILE* p = ::popen(cmd.c_str(), "r");
  if (!p) return out;
  char line[4096];
  while (std::fgets(line, sizeof(line), p)) {
    const std::string s(line);
    const size_t at = s.find("# setup ");
    if (at == std::string::npos) continue;
    std::istringstream is(s.substr(at + 8));
    for (std::string kv; is >> kv;) {
      const size_t eq = kv.find('=');
      if (eq != std::string::npos) out[kv.substr(0, eq)] = std::stod(kv.substr(eq + 1));
    }
  }
  ::pclose(p);
  return out;
}

TEST(SetupCounts, TcpStoreRequestsGrowLinearlyWithTheRanks) {
  for (int n : {8, 24}) {
    const auto s = setupOf(n, "GFLOW_SHM=0 GFLOW_CONNECT=all");
    ASSERT_FALSE(s.empty()) << n << " ranks: no # setup line";
    EXPECT_EQ(s.at("peers_max"), n - 1) << n << " ranks";
    EXPECT_EQ(s.at("sockets_max"), n - 1) << n << " ranks";
    // Per rank: its communicator's generation, its address and one
    // multi-get of every address; and polls for failures while waiting to
    // be dialed, at 100 ms, 300 ms, 700 ms... (a slow machine's setup polls
    // more). Before the multi-get it was N^2 + N: 72 and 600.
    EXPECT_GE(s.at("store_served"), 3 * n) << n << " ranks";
    EXPECT_LE(s.at("store_served"), 7 * n) << n << " ranks";
    EXPECT_LE(s.at("store_requests_max"), 7) << n << " ranks";
  }
}

// On demand the setup waits for nobody: exactly 3 requests per rank, and a
// rank of a 4 KiB allreduce_bw run (recursive doubling, with creation's
// own exchanges) connects to its log2(N) partners and at most a few more.
TEST(SetupCounts, OnDemandConnectionsAreLogarithmicAndStoreRequestsExact) {
  for (int n : {16, 64, 128}) {
    const auto s = setupOf(n, "GFLOW_SHM=0 GFLOW_CONNECT=lazy");
    ASSERT_FALSE(s.empty()) << n << " ranks: no # setup line";
    const int log2n = n == 16 ? 4 : n == 64 ? 6 : 7;
    EXPECT_GE(s.at("peers_max"), log2n) << n << " ranks";
    EXPECT_LE(s.at("peers_max"), 2 * log2n + 4) << n << " ranks";
    EXPECT_EQ(s.at("sockets_max"), s.at("peers_max")) << n << " ranks";
    EXPECT_EQ(s.at("store_served"), 3 * n) << n << " ranks";
    EXPECT_EQ(s.at("store_requests_max"), 3) << n << " ranks";
  }
}

TEST(SetupCounts, OneHostStoreRequestsGrowLinearlyWithTheRanks) {
  const int n = 16;
  const auto s = setupOf(n, "");
  ASSERT_FALSE(s.empty()) << "no # setup line";
  EXPECT_EQ(s.at("peers_max"), n - 1);
  EXPECT_GT(s.at("shared_bytes"), 0);
  // The TCP setup above and the group's: two sets and two multi-gets (and
  // the polls). Before the multi-gets it was about 2N^2: 512.
  EXPECT_LE(s.at("store_served"), 14 * n);
}

// 128 processes finish their last allreduce and exit, five times over: a
// rank that has left may reset a socket its partner still watches (for
// bytes it closed unread), and that partner, which needs nothing more from
// it, must finish its own op and exit 0. Before the reset was taken as an
// EOF when nothing is pending (TcpContext::handleReset), about one run in
// six failed "rank N reset the connection" here.
TEST(SetupCounts, ManyRanksFinishTheirLastOpAndExitCleanly) {
  for (int run = 0; run < 5; ++run) {
    const std::string cmd = std::string("GFLOW_SHM=0 ") + GFLOW_TEST_GFLOWRUN + " -n 128 " +
                            GFLOW_TEST_ALLREDUCE_BW + " -b 4K -e 4K -n 3 -w 1 >/dev/null 2>&1";
    EXPECT_EQ(std::system(cmd.c_str()), 0) << "run " << run;
  }
}

#endif

}  // namespace
