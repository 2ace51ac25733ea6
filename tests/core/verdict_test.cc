// Verdict::settle (core/verdict.h) over a scripted backend: where the
// survivors blame different ranks, a blamed rank that reported (it only
// waited for another) passes the blame on to the rank that never reported,
// so every survivor settles on that one; where they agree, nobody waits for
// the culprit's report.
#include "core/verdict.h"

#include <gtest/gtest.h>

#include <deque>
#include <vector>

namespace gflow {
namespace {

// Only what settle() uses: abort, notifyPeers and awaitReports, whose
// answers are scripted call by call.
class ScriptedBackend final : public backend::Backend {
 public:
  std::deque<std::vector<Error>> answers;  // one per awaitReports call
  std::vector<int> excluded;               // each call's `exclude`

  std::vector<Error> awaitReports(Deadline, int exclude) override {
    excluded.push_back(exclude);
    if (answers.empty()) return {};
    std::vector<Error> next = answers.front();
    answers.pop_front();
    return next;
  }
  void abort(const Error&) override {}
  void notifyPeers(const Error&) override {}
  void allreduce(const backend::Op&, const void*, void*) override { unused(); }
  void reduceScatter(const backend::Op&, const void*, void*) override { unused(); }
  void allgather(const backend::Op&, const void*, void*) override { unused(); }
  void broadcast(const backend::Op&, void*) override { unused(); }
  void barrier(const backend::Op&) override { unused(); }
  const char* name() const override { return "scripted"; }
  PeerStats peerStats(int) const override { return {}; }
  void registerMemory(void*, size_t,
                      std::vector<std::unique_ptr<transport::MemoryRegion>>*) override {}

 private:
  static void unused() { FAIL() << "settle() ran an op"; }
};

constexpr uint64_t kSeq = 7;

// Rank `reporter`'s report: it failed op kSeq blaming `culprit`.
Error report(int reporter, int culprit) {
  return Error(ErrorCode::kTimeout, "waited for rank " + std::to_string(culprit),
               ErrorContext::forOp("allreduce")
                   .withSeq(kSeq)
                   .withRank(0)
                   .withPeer(reporter)
                   .withCulprit(culprit, kSeq));
}

// Rank `rank`'s own failure of op kSeq, blaming `culprit`.
Error candidate(int rank, int culprit) {
  return Error(ErrorCode::kTimeout, "no answer from rank " + std::to_string(culprit),
               ErrorContext::forOp("allreduce").withSeq(kSeq).withRank(rank).withPeer(culprit));
}

Error settle(ScriptedBackend& b, int rank, int size, const Error& mine) {
  Verdict v;
  v.attach({rank, size, std::chrono::milliseconds(2000), &b, nullptr});
  return v.settle(mine);
}

// Two pretend hosts {0,1} {2,3}; rank 3 stopped. Rank 2 waits for it in the
// local phase; rank 0 waits for rank 2 across hosts and blames it; rank 1
// waits for rank 3 across hosts.
TEST(Verdict, ABlamedRankThatReportedPassesTheBlameToTheSilentOne) {
  ScriptedBackend b;
  b.answers = {{report(1, 3)}, {report(1, 3), report(2, 3)}};
  const Error v = settle(b, 0, 4, candidate(0, 2));
  EXPECT_EQ(v.peer(), 3) << v.what();
  EXPECT_EQ(v.seq(), kSeq);
  EXPECT_EQ(b.excluded, (std::vector<int>{2, -1})) << "rank 2's report is awaited too";

  for (int rank : {1, 2}) {  // the others, from their side
    ScriptedBackend o;
    o.answers = {{report(rank == 1 ? 2 : 1, 3), report(0, 2)}, {report(0, 2), report(3 - rank, 3)}};
    EXPECT_EQ(settle(o, rank, 4, candidate(rank, 3)).peer(), 3) << "rank " << rank;
  }
}

TEST(Verdict, SurvivorsThatAgreeDoNotWaitForTheCulprit) {
  ScriptedBackend b;
  b.answers = {{report(1, 3), report(2, 3)}};
  const Error v = settle(b, 0, 4, candidate(0, 3));
  EXPECT_EQ(v.peer(), 3);
  EXPECT_EQ(b.excluded, std::vector<int>{3}) << "one wait, without rank 3";
}

// Every blamed rank reported (each blames another): nobody is silent, so
// the least culprit stands, on every rank alike.
TEST(Verdict, WhereEveryBlamedRankReportedTheLeastCulpritStands) {
  for (int rank = 0; rank < 3; ++rank) {
    const int mine = (rank + 1) % 3;
    std::vector<Error> others;
    for (int r = 0; r < 3; ++r) {
      if (r != rank) others.push_back(report(r, (r + 1) % 3));
    }
    ScriptedBackend b;
    b.answers = {others, others};
    EXPECT_EQ(settle(b, rank, 3, candidate(rank, mine)).peer(), 0) << "rank " << rank;
  }
}

}  // namespace
}  // namespace gflow
