// Process-based fault tests: every rank is a separate fault_worker process
// (tests/faults/fault_worker.cc), started here with fork/exec and its identity
// in GFLOW_* variables, so faults are real: SIGKILL, SIGSTOP, wrong tokens,
// ranks calling different collectives (garbage_fault_test.cc: strangers on
// the store and data ports).
//
// Each test owns a Job: a set of rank processes with stdout/stderr in files (so
// nothing has to be drained while waiting), reaped with their exit times, and
// a hard deadline after which every process is SIGKILLed and the test fails
// instead of hanging. Children also die with the test binary (PDEATHSIG).
#include <arpa/inet.h>
#include <dirent.h>
#include <fcntl.h>
#include <gtest/gtest.h>
#include <netinet/in.h>
#include <signal.h>
#include <sys/prctl.h>
#include <sys/socket.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <fstream>
#include <functional>
#include <map>
#include <random>
#include <regex>
#include <set>
#include <sstream>
#include <string>
#include <thread>
#include <vector>

#include "bootstrap/store_protocol.h"
#include "common/auth.h"
#include "common/socket.h"
#include "gflow/gflow.h"
#include "transport/tcp/frame.h"

#include "faults/job.h"

namespace {

using namespace gflow::faulttest;
using std::chrono::milliseconds;
using std::chrono::seconds;

// ---- 1. kill -9 mid-loop ---------------------------------------------------

// `path`: how the ranks of this one machine talk. "shm": shared memory (the
// default for ranks of one host); "tcp": GFLOW_SHM=0; "hier": GFLOW_HOST_ID
// splits the ranks into two pretend hosts (shared memory inside each, TCP
// between them, hierarchical collectives).
struct RankCase {
  int size;
  int victim;
  const char* path = "shm";
};

void PrintTo(const RankCase& c, std::ostream* os) {
  *os << c.size << " ranks, rank " << c.victim << ", " << c.path;
}

std::string caseName(const ::testing::TestParamInfo<RankCase>& info) {
  return "n" + std::to_string(info.param.size) + "_rank" + std::to_string(info.param.victim) + "_" +
         info.param.path;
}

void setPath(Job& job, const RankCase& c) {
  if (std::string(c.path) == "tcp") job.setEnv("GFLOW_SHM", "0");
  if (std::string(c.path) == "hier") {
    for (int r = 0; r < c.size; ++r) {
      job.setRankEnv(r, "GFLOW_HOST_ID", "pretend-host-" + std::to_string(r * 2 / c.size));
    }
  }
}

// Names in /dev/shm (gflow's segments are memfds and never appear there).
std::set<std::string> devShmEntries() {
  std::set<std::string> names;
  if (DIR* d = ::opendir("/dev/shm")) {
    while (dirent* e = ::readdir(d)) names.insert(e->d_name);
    ::closedir(d);
  }
  return names;
}

class FaultKill : public ::testing::TestWithParam<RankCase> {};

TEST_P(FaultKill, SurvivorsReportPeerLostNamingTheKilledRank) {
  const int n = GetParam().size, victim = GetParam().victim;
  const std::set<std::string> shmBefore = devShmEntries();
  Job job(n, sameArgs({"loop", "0", k4MiB}));
  setPath(job, GetParam());
  job.start();
  ASSERT_TRUE(job.waitProgress(3, seconds(8))) << job.report();
  const Clock::time_point killed = job.signal(victim, SIGKILL);
  ASSERT_TRUE(job.waitExit(seconds(11))) << job.report();
  const std::string report = job.report();
  EXPECT_EQ(job.result(victim).signal, SIGKILL) << report;
  for (int r = 0; r < n; ++r) {
    if (r == victim) continue;
    const RankResult& res = job.result(r);
    const double took = secondsSince(killed, res.exitTime);
    logRank("n=" + std::to_string(n) + " kill rank " + std::to_string(victim), r, took, res);
    EXPECT_EQ(res.exitCode, exitCodeFor(gflow::ErrorCode::kPeerLost)) << "rank " << r << "\n"
                                                                      << report;
    EXPECT_EQ(res.code, "peer_lost") << "rank " << r << "\n" << report;
    EXPECT_TRUE(res.names(victim))
        << "rank " << r << " does not name rank " << victim << ": " << res.what;
    EXPECT_LT(took, 10.0) << "rank " << r << "\n" << report;
  }
  for (const std::string& name : devShmEntries()) {
    EXPECT_TRUE(shmBefore.count(name)) << "/dev/shm/" << name << " appeared during the job";
  }
}

INSTANTIATE_TEST_SUITE_P(, FaultKill,
                         ::testing::Values(RankCase{3, 1}, RankCase{4, 2}, RankCase{3, 0},
                                           RankCase{3, 1, "tcp"}, RankCase{4, 2, "tcp"},
                                           RankCase{4, 1, "hier"}, RankCase{4, 2, "hier"}),
                         caseName);

// A rank killed during all-to-all, a rooted op (reduce to rank 0) or a
// point-to-point wait (a sendRecv ring): the survivors raise peer_lost
// naming it, on every path.
struct OpKillCase {
  const char* op;
  RankCase ranks;
};
class FaultKillOp : public ::testing::TestWithParam<OpKillCase> {};

TEST_P(FaultKillOp, SurvivorsReportPeerLostNamingTheKilledRank) {
  const RankCase& c = GetParam().ranks;
  Job job(c.size, sameArgs({"op", GetParam().op, "loop", "0", "1048576"}));
  setPath(job, c);
  job.start();
  ASSERT_TRUE(job.waitProgress(3, seconds(8))) << job.report();
  const Clock::time_point killed = job.signal(c.victim, SIGKILL);
  ASSERT_TRUE(job.waitExit(seconds(11))) << job.report();
  const std::string report = job.report();
  for (int r = 0; r < c.size; ++r) {
    if (r == c.victim) continue;
    const RankResult& res = job.result(r);
    logRank(std::string(GetParam().op) + " kill rank " + std::to_string(c.victim), r,
            secondsSince(killed, res.exitTime), res);
    EXPECT_EQ(res.code, "peer_lost") << "rank " << r << "\n" << report;
    EXPECT_TRUE(res.names(c.victim))
        << "rank " << r << " does not name rank " << c.victim << ": " << res.what;
  }
}

INSTANTIATE_TEST_SUITE_P(
    , FaultKillOp,
    ::testing::Values(
        OpKillCase{"alltoall", RankCase{3, 1}}, OpKillCase{"alltoall", RankCase{4, 2, "tcp"}},
        OpKillCase{"alltoall", RankCase{4, 1, "hier"}}, OpKillCase{"reduce", RankCase{3, 2}},
        OpKillCase{"reduce", RankCase{4, 0, "tcp"}}, OpKillCase{"reduce", RankCase{4, 3, "tcp"}},
        OpKillCase{"sendrecv", RankCase{3, 1}}, OpKillCase{"sendrecv", RankCase{4, 2, "hier"}},
        OpKillCase{"alltoallv", RankCase{3, 2}}, OpKillCase{"alltoallv", RankCase{4, 1, "hier"}}),
    [](const ::testing::TestParamInfo<OpKillCase>& i) {
      return std::string(i.param.op) + "_" + caseName({i.param.ranks, i.index});
    });

// A rank killed in the middle of GradientReducer steps: the survivors' wait()
// raises peer_lost naming it (fixed buckets and negotiated rounds).
class FaultKillReducer : public ::testing::TestWithParam<const char*> {};

TEST_P(FaultKillReducer, SurvivorsWaitRaisesPeerLost) {
  const int n = 3, victim = 1;
  Job job(n, sameArgs({"reducer", "0", GetParam()}));
  job.setEnv("GFLOW_SHM", "0");
  job.start();
  ASSERT_TRUE(job.waitProgress(3, seconds(8))) << job.report();
  const Clock::time_point killed = job.signal(victim, SIGKILL);
  ASSERT_TRUE(job.waitExit(seconds(11))) << job.report();
  const std::string report = job.report();
  for (int r = 0; r < n; ++r) {
    if (r == victim) continue;
    const RankResult& res = job.result(r);
    logRank(std::string("reducer cycle ") + GetParam() + " kill rank 1", r,
            secondsSince(killed, res.exitTime), res);
    EXPECT_EQ(res.code, "peer_lost") << "rank " << r << "\n" << report;
    EXPECT_TRUE(res.names(victim)) << "rank " << r << ": " << res.what;
  }
}

INSTANTIATE_TEST_SUITE_P(, FaultKillReducer, ::testing::Values("0", "2"),
                         [](const ::testing::TestParamInfo<const char*>& i) {
                           return std::string("cycle") + i.param;
                         });

// ---- 2. SIGSTOP mid-loop with a short timeout -------------------------------

class FaultStop : public ::testing::TestWithParam<RankCase> {};

TEST_P(FaultStop, SurvivorsTimeOutNamingTheStoppedRank) {
  const int n = GetParam().size, victim = GetParam().victim;
  Job job(n, sameArgs({"loop", "0", k4MiB}));
  job.setEnv("GFLOW_TIMEOUT", "3s");
  setPath(job, GetParam());
  job.start();
  ASSERT_TRUE(job.waitProgress(3, seconds(6))) << job.report();
  const Clock::time_point stopped = job.signal(victim, SIGSTOP);
  std::vector<int> survivors;
  for (int r = 0; r < n; ++r) {
    if (r != victim) survivors.push_back(r);
  }
  const bool allFailed = job.waitExit(seconds(7), survivors);
  EXPECT_FALSE(job.exited(victim)) << "the stopped rank exited\n" << job.report();
  job.signal(victim, SIGKILL);
  ASSERT_TRUE(allFailed) << job.report();
  ASSERT_TRUE(job.waitExit(seconds(3))) << job.report();
  const std::string report = job.report();
  for (int r : survivors) {
    const RankResult& res = job.result(r);
    const double took = secondsSince(stopped, res.exitTime);
    logRank("n=" + std::to_string(n) + " stop rank " + std::to_string(victim), r, took, res);
    EXPECT_TRUE(res.code == "timeout" || res.code == "peer_lost") << "rank " << r << "\n" << report;
    EXPECT_EQ(res.exitCode, res.code == "timeout" ? exitCodeFor(gflow::ErrorCode::kTimeout)
                                                  : exitCodeFor(gflow::ErrorCode::kPeerLost))
        << "rank " << r << "\n"
        << report;
    EXPECT_TRUE(res.names(victim)) << "rank " << r << " blames someone else than the stopped rank "
                                   << victim << ": " << res.what;
    EXPECT_LT(took, 3.0 + 2.0) << "rank " << r << "\n" << report;
  }
}

INSTANTIATE_TEST_SUITE_P(, FaultStop,
                         ::testing::Values(RankCase{3, 1}, RankCase{4, 3}, RankCase{3, 1, "tcp"},
                                           RankCase{4, 3, "hier"}),
                         caseName);

// ---- 2b. one verdict: every survivor names the same culprit ---------------

// 4 ranks; in each trial one rank, chosen at random, is killed (SIGKILL) or
// stopped (SIGSTOP) at a random point of an allreduce loop of a random size.
// Every survivor must raise the same error code for the same op sequence
// number naming the same culprit (Error::peer()), the victim, within the
// op's deadline + 2 s. The seed is printed (GFLOW_TEST_SEED replays it).
class FaultVerdict : public ::testing::TestWithParam<const char*> {};

TEST_P(FaultVerdict, SurvivorsAgreeOnCodeOpAndCulprit) {
  constexpr int kRanks = 4, kTrials = 20;
  const char* seedVar = std::getenv("GFLOW_TEST_SEED");
  const unsigned seed = seedVar ? static_cast<unsigned>(std::stoul(seedVar))
                                : static_cast<unsigned>(std::random_device{}());
  std::mt19937 rng(seed);
  std::printf("FaultVerdict %s: seed %u\n", GetParam(), seed);
  const char* sizes[] = {"4096", "262144", "1048576"};
  std::vector<double> detect;
  for (int trial = 0; trial < kTrials; ++trial) {
    const int victim = static_cast<int>(rng() % kRanks);
    const bool stop = rng() % 2 == 1;
    const std::string bytes = sizes[rng() % 3];
    const int delayMs = static_cast<int>(rng() % 200);
    const std::string what = std::string("trial ") + std::to_string(trial) + ": " +
                             (stop ? "SIGSTOP" : "SIGKILL") + " rank " + std::to_string(victim) +
                             ", " + bytes + " B, after " + std::to_string(delayMs) + " ms";
    Job job(kRanks, sameArgs({"loop", "0", bytes}), seconds(25));
    job.setEnv("GFLOW_TIMEOUT", "2s");
    setPath(job, RankCase{kRanks, victim, GetParam()});
    job.start();
    ASSERT_TRUE(job.waitProgress(2, seconds(10))) << what << "\n" << job.report();
    std::this_thread::sleep_for(milliseconds(delayMs));
    const Clock::time_point faulted = job.signal(victim, stop ? SIGSTOP : SIGKILL);
    std::vector<int> survivors;
    for (int r = 0; r < kRanks; ++r) {
      if (r != victim) survivors.push_back(r);
    }
    const bool allFailed = job.waitExit(seconds(7), survivors);
    if (stop) job.signal(victim, SIGKILL);
    ASSERT_TRUE(allFailed) << what << "\n" << job.report();
    ASSERT_TRUE(job.waitExit(seconds(3))) << what << "\n" << job.report();
    const RankResult& first = job.result(survivors[0]);
    for (int r : survivors) {
      const RankResult& res = job.result(r);
      const double took = secondsSince(faulted, res.exitTime);
      detect.push_back(took);
      EXPECT_FALSE(res.code.empty()) << what << ": rank " << r << " raised nothing\n"
                                     << job.report();
      EXPECT_EQ(res.code, first.code) << what << ": rank " << r << "\n" << job.report();
      EXPECT_EQ(res.seq, first.seq) << what << ": rank " << r << "\n" << job.report();
      EXPECT_EQ(res.peer, victim) << what << ": rank " << r << " names rank " << res.peer
                                  << " as the culprit: " << res.what;
      EXPECT_LT(took, 2.0 + 2.0) << what << ": rank " << r << "\n" << job.report();
    }
    if (HasFailure()) return;
  }
  std::sort(detect.begin(), detect.end());
  std::printf("FaultVerdict %s: %d trials, detection min %.2f median %.2f max %.2f s\n", GetParam(),
              kTrials, detect.front(), detect[detect.size() / 2], detect.back());
}

INSTANTIATE_TEST_SUITE_P(, FaultVerdict, ::testing::Values("shm", "tcp", "hier"),
                         [](const ::testing::TestParamInfo<const char*>& i) {
                           return std::string(i.param);
                         });

// ---- 3. a rank with another job token ---------------------------------------

class FaultToken : public ::testing::TestWithParam<RankCase> {};

TEST_P(FaultToken, WrongTokenIsUnauthorizedAndNobodyHangs) {
  const int n = GetParam().size, intruder = GetParam().victim;
  Job job(n, sameArgs({"loop", "3", "65536"}));
  job.setEnv("GFLOW_TIMEOUT", "5s");
  job.setRankEnv(intruder, "GFLOW_JOB_TOKEN", "another-job");
  job.start();
  ASSERT_TRUE(job.waitExit(seconds(5 + 4))) << job.report();
  const std::string report = job.report();
  int unauthorized = 0;
  for (int r = 0; r < n; ++r) {
    const RankResult& res = job.result(r);
    logRank("token of rank " + std::to_string(intruder) + " differs", r,
            secondsSince(job.started(), res.exitTime), res);
    EXPECT_NE(res.exitCode, 0) << "rank " << r << " completed a job with a stranger\n" << report;
    EXPECT_FALSE(res.code.empty()) << "rank " << r << " printed no GFLOW_ERROR\n" << report;
    if (res.code == "unauthorized") {
      ++unauthorized;
      EXPECT_EQ(res.exitCode, exitCodeFor(gflow::ErrorCode::kUnauthorized)) << report;
    }
  }
  EXPECT_GE(unauthorized, 1) << report;
  if (intruder != 0) {
    // Rank 0's store refuses the intruder.
    EXPECT_EQ(job.result(intruder).code, "unauthorized") << report;
  } else {
    // The store itself has the other token: every other rank is refused.
    for (int r = 1; r < n; ++r) EXPECT_EQ(job.result(r).code, "unauthorized") << report;
  }
}

INSTANTIATE_TEST_SUITE_P(, FaultToken, ::testing::Values(RankCase{3, 2}, RankCase{3, 0}), caseName);

// ---- 5. ranks calling different collectives ---------------------------------

struct MismatchCase {
  int size;
  const char* kind;  // fault_worker's mismatch kind
};

void PrintTo(const MismatchCase& c, std::ostream* os) {
  *os << c.size << " ranks, " << c.kind;
}

class FaultMismatch : public ::testing::TestWithParam<MismatchCase> {};

// Which rank notices first, and whether the others are still sending to it
// when it leaves, varies from run to run, so each case runs several jobs.
TEST_P(FaultMismatch, EveryRankRaisesMismatchNamingTheRanks) {
  const int n = GetParam().size;
  for (int attempt = 0; attempt < 8 && !HasFailure(); ++attempt) {
    Job job(n, sameArgs({"mismatch", GetParam().kind, "1048576"}));
    job.start();
    ASSERT_TRUE(job.waitExit(seconds(5))) << job.report();
    const std::string report = "attempt " + std::to_string(attempt) + ": " + job.report();
    for (int r = 0; r < n; ++r) {
      const RankResult& res = job.result(r);
      if (attempt == 0) {
        logRank("mismatch " + std::string(GetParam().kind), r,
                secondsSince(job.started(), res.exitTime), res);
      }
      EXPECT_EQ(res.exitCode, exitCodeFor(gflow::ErrorCode::kMismatch)) << "rank " << r << "\n"
                                                                        << report;
      EXPECT_EQ(res.code, "mismatch") << "rank " << r << ": " << res.what;
      // Rank 1 disagrees with everyone else: both sides are named.
      bool namesOther = false;
      for (int o = 0; o < n; ++o) namesOther |= (o != 1 && res.names(o));
      EXPECT_TRUE(res.names(1) && namesOther)
          << "rank " << r << "'s message does not name rank 1 and one of the others: " << res.what;
    }
  }
}

std::string mismatchName(const ::testing::TestParamInfo<MismatchCase>& info) {
  return "n" + std::to_string(info.param.size) + "_" + info.param.kind;
}

INSTANTIATE_TEST_SUITE_P(, FaultMismatch,
                         ::testing::Values(MismatchCase{3, "op"}, MismatchCase{4, "op"},
                                           MismatchCase{3, "count"}),
                         mismatchName);

// A disagreement at op #3 must fail op #3 everywhere. A rank still finishing
// op #2 (which every rank called alike) when a peer's report of #3 arrives
// must not raise for #2: the others returned from #2 successfully. The race
// needs a slow rank, so the job is repeated.
TEST(FaultMismatchSeq, EveryRankFailsTheDisagreeingOp) {
  for (int attempt = 0; attempt < 10; ++attempt) {
    Job job(3, sameArgs({"mismatch", "count", "1048576"}));
    job.start();
    ASSERT_TRUE(job.waitExit(seconds(5))) << job.report();
    const std::string report = job.report();
    for (int r = 0; r < 3; ++r) {
      const RankResult& res = job.result(r);
      // #1 is create()'s internal allgather, #2 the common allreduce, #3 the odd one.
      ASSERT_EQ(res.seq, 3) << "attempt " << attempt << ": rank " << r
                            << " raised for another op than the one the ranks disagree on ("
                            << res.printed("GFLOW_PROGRESS") << " progress)\n"
                            << report;
    }
  }
}

// ---- 6. a rank that exits right after the last op ---------------------------

class FaultExit : public ::testing::TestWithParam<RankCase> {};

TEST_P(FaultExit, RankLeavingAfterLastOpDoesNotFailTheOthers) {
  const int n = GetParam().size, leaver = GetParam().victim;
  Job job(n, [leaver](int r) {
    std::vector<std::string> a = {"loop", "5", k4MiB};
    if (r != leaver) a.insert(a.begin(), {"linger", "1000"});
    return a;
  });
  job.start();
  ASSERT_TRUE(job.waitExit(seconds(12))) << job.report();
  const std::string report = job.report();
  for (int r = 0; r < n; ++r) {
    EXPECT_EQ(job.result(r).exitCode, 0) << "rank " << r << "\n" << report;
    EXPECT_TRUE(job.result(r).printed("GFLOW_DONE")) << "rank " << r << "\n" << report;
    if (r != leaver) {
      EXPECT_TRUE(job.result(r).printed("GFLOW_LINGERED")) << "rank " << r << "\n" << report;
    }
  }
}

TEST(FaultExitStriped, LeavingWithSeveralSocketsPerPeerFailsNobody) {
  // With several connections per peer, EOF on one of them while the last
  // message still arrives on another must not count as a lost peer.
  for (int leaver : {0, 2}) {
    Job job(3, [leaver](int r) {
      std::vector<std::string> a = {"loop", "20", "65536"};
      if (r != leaver) a.insert(a.begin(), {"linger", "500"});
      return a;
    });
    job.setEnv("GFLOW_SOCKETS_PER_PEER", "3");
    job.setEnv("GFLOW_STRIPE_MIN", "4096");
    job.start();
    ASSERT_TRUE(job.waitExit(seconds(12))) << job.report();
    for (int r = 0; r < 3; ++r) {
      EXPECT_EQ(job.result(r).exitCode, 0) << "leaver " << leaver << " rank " << r << "\n"
                                           << job.report();
    }
  }
}

INSTANTIATE_TEST_SUITE_P(, FaultExit,
                         ::testing::Values(RankCase{3, 2}, RankCase{3, 0}, RankCase{4, 1}),
                         caseName);

}  // namespace
