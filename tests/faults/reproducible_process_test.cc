// Reproducible mode with every rank a process (fault_worker `reproduce`):
// the digest of a float32 allreduce is that of the fixed-order reference
// computed here, on every rank and under every layout (shared memory, TCP
// with ring, two pretend hosts, several sockets and small pieces, the work
// cut into ops of several sizes); the default mode's digest differs in at
// least one layout. And a rank killed in the middle of reproducible
// allreduces leaves the survivors with peer_lost naming it.
#include <gtest/gtest.h>

#include <map>
#include <regex>
#include <string>
#include <vector>

#include "faults/job.h"
#include "faults/reproducible_values.h"
#include "testing/fixed_tree.h"

namespace {

using namespace gflow::faulttest;
using std::chrono::seconds;

constexpr int kRanks = 4;
constexpr size_t kCount = 200003;

uint64_t referenceDigest() {
  std::vector<std::vector<float>> in;
  for (int r = 0; r < kRanks; ++r) in.push_back(reproducibleInput(r, kCount));
  std::vector<float> sum(kCount);
  std::vector<float> x(kRanks);
  for (size_t i = 0; i < kCount; ++i) {
    for (int r = 0; r < kRanks; ++r) x[r] = in[r][i];
    sum[i] = gflow::testing::fixedTreeSum(x);
  }
  return digestOf(sum);
}

struct ProcLayout {
  const char* name;
  std::map<std::string, std::string> env;
  bool twoHosts = false;
  const char* cut = "0";  // elements per op; 0: one op
};

std::vector<ProcLayout> procLayouts() {
  return {
      {"shm", {}, false, "0"},
      {"shm_cut", {{"GFLOW_SHM_CHUNK", "8192"}}, false, "30011"},
      {"tcp_ring", {{"GFLOW_SHM", "0"}, {"GFLOW_ALGO", "ring"}}, false, "0"},
      {"tcp_sockets_pieces",
       {{"GFLOW_SHM", "0"}, {"GFLOW_SOCKETS_PER_PEER", "2"}, {"GFLOW_PIECE_BYTES", "4K"}},
       false,
       "77777"},
      {"two_hosts", {}, true, "0"},
  };
}

// Every rank's digest of one job, or an empty vector (with a failure) when
// the job did not finish cleanly.
std::vector<uint64_t> digests(const ProcLayout& l, bool reproducible) {
  Job job(
      kRanks,
      [&](int) {
        return std::vector<std::string>{"reproduce", std::to_string(kCount), l.cut};
      },
      seconds(40));
  for (const auto& [k, v] : l.env) job.setEnv(k, v);
  job.setEnv("GFLOW_REPRODUCIBLE", reproducible ? "1" : "0");
  if (l.twoHosts) {
    for (int r = 0; r < kRanks; ++r) {
      job.setRankEnv(r, "GFLOW_HOST_ID", "pretend-host-" + std::to_string(r * 2 / kRanks));
    }
  }
  job.start();
  if (!job.waitExit(seconds(35))) {
    ADD_FAILURE() << l.name << ": the job did not finish\n" << job.report();
    return {};
  }
  std::vector<uint64_t> out;
  static const std::regex kDigest("GFLOW_DIGEST rank=\\d+ digest=(\\d+)");
  for (int r = 0; r < kRanks; ++r) {
    std::smatch m;
    const std::string& text = job.result(r).out;
    if (job.result(r).exitCode != 0 || !std::regex_search(text, m, kDigest)) {
      ADD_FAILURE() << l.name << ": rank " << r << " failed\n" << job.report();
      return {};
    }
    out.push_back(std::stoull(m[1].str()));
  }
  return out;
}

TEST(ReproducibleProcesses, EveryLayoutGivesTheFixedOrderDigest) {
  const uint64_t want = referenceDigest();
  bool defaultDiffers = false;
  for (const ProcLayout& l : procLayouts()) {
    const std::vector<uint64_t> got = digests(l, true);
    ASSERT_EQ(got.size(), static_cast<size_t>(kRanks)) << l.name;
    for (int r = 0; r < kRanks; ++r) {
      EXPECT_EQ(got[r], want) << l.name << ": rank " << r << " differs from the fixed order";
    }
    const std::vector<uint64_t> plain = digests(l, false);
    ASSERT_EQ(plain.size(), static_cast<size_t>(kRanks)) << l.name;
    if (plain[0] != want) defaultDiffers = true;
  }
  EXPECT_TRUE(defaultDiffers) << "no layout of the default mode differs from the fixed order";
}

// SIGKILL of rank 2 while the ranks run reproducible allreduces (4 MiB,
// over TCP and over shared memory): the others raise peer_lost naming it.
TEST(ReproducibleProcesses, AKilledRankIsPeerLostForTheOthers) {
  for (const char* shm : {"0", "1"}) {
    Job job(kRanks, sameArgs({"loop", "0", k4MiB}));
    job.setEnv("GFLOW_REPRODUCIBLE", "1");
    job.setEnv("GFLOW_SHM", shm);
    job.start();
    ASSERT_TRUE(job.waitProgress(3, seconds(8))) << job.report();
    job.signal(2, SIGKILL);
    ASSERT_TRUE(job.waitExit(seconds(11))) << job.report();
    for (int r = 0; r < kRanks; ++r) {
      if (r == 2) continue;
      const RankResult& res = job.result(r);
      EXPECT_EQ(res.code, "peer_lost") << "GFLOW_SHM=" << shm << " rank " << r << "\n"
                                       << job.report();
      EXPECT_TRUE(res.names(2)) << "GFLOW_SHM=" << shm << " rank " << r << ": " << res.what;
    }
  }
}

}  // namespace
