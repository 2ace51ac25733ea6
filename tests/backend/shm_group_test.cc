// shm::Group's single-copy reads (backend/shm/group.h): members agree on
// whether they can read each other's memory, read the buffers a member
// published, and a buffer that cannot be read is an error naming its owner.
// And its liveness probe: a waiter past its deadline tells a member that
// waits itself from one that is stalled, and lets the former report first.
// The allreduce that uses them is checked against exact sums with every
// other collective test (tests/testing/test_env.cc sends 16 KiB and more
// through it at every group size).
#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include <sys/mman.h>
#include <unistd.h>

#include <atomic>
#include <numeric>
#include <sstream>
#include <thread>
#include <vector>

#include "backend/shm/group.h"
#include "testing/contexts.h"
#include "testing/ranks.h"

namespace gflow::backend::shm {
namespace {

using testing::onThreads;

GroupOptions optionsFor(int rank, int size, const std::shared_ptr<Store>& store) {
  GroupOptions o;
  o.rank = rank;
  o.size = size;
  o.store = store;
  o.prefix = "t/";
  o.timeout = std::chrono::milliseconds(20000);
  return o;
}

std::unique_ptr<Group> connectOrFail(const GroupOptions& o) {
  std::string why;
  auto g = Group::connect(o, &why);
  if (!g) throw Error(ErrorCode::kInternal, "connect: " + why, ErrorContext{});
  return g;
}

Envelope envelope() {
  Envelope e;
  e.words[0] = 42;
  return e;
}

Deadline soon() {
  return Deadline::after(std::chrono::seconds(20));
}

TEST(ShmSingleCopy, MembersReadTheBuffersEachPublished) {
  constexpr int n = 3;
  constexpr size_t count = 10000;
  auto errs = onThreads(n, [&](int r, const std::shared_ptr<Store>& store) {
    auto g = connectOrFail(optionsFor(r, n, store));
    ASSERT_TRUE(g->singleCopy());  // threads of one process can always read it
    std::vector<int32_t> in(count), out(count);
    std::iota(in.begin(), in.end(), r * 1000000);
    std::iota(out.begin(), out.end(), -r * 1000000);
    g->beginOp(1, envelope(), soon());
    g->publishBuffers(in.data(), count * 4, out.data(), count * 4);
    g->sync();
    EXPECT_TRUE(g->publishedReadable());
    for (int m = 0; m < n; ++m) {
      if (m == r) continue;
      std::vector<int32_t> got(100);
      g->readPeer(m, Group::Buffer::kIn, 5000 * sizeof(int32_t), got.data(), 400);
      for (int i = 0; i < 100; ++i) EXPECT_EQ(got[i], m * 1000000 + 5000 + i);
      g->readPeer(m, Group::Buffer::kOut, 0, got.data(), 400);
      for (int i = 0; i < 100; ++i) EXPECT_EQ(got[i], -m * 1000000 + i);
    }
    g->sync();  // nobody returns (and frees its buffers) while others read
    g->endOp();
    EXPECT_EQ(g->peerStats((r + 1) % n).bytesReceived, 800u);
  });
  testing::expectNoErrors(errs);
}

TEST(ShmSingleCopy, OneMemberThatDoesNotProbeTurnsItOffForAll) {
  constexpr int n = 3;
  auto errs = onThreads(n, [&](int r, const std::shared_ptr<Store>& store) {
    GroupOptions o = optionsFor(r, n, store);
    o.probeSingleCopy = r != 1;
    auto g = connectOrFail(o);
    EXPECT_FALSE(g->singleCopy()) << "member " << r;
  });
  testing::expectNoErrors(errs);
}

// A member whose published buffer is not mapped (a bad pointer, freed
// memory): the reader raises kInternal naming that member's rank, never
// crashes, and the failure stays with the group.
TEST(ShmSingleCopy, AnUnreadableBufferIsAnErrorNamingItsOwner) {
  constexpr int n = 2;
  void* hole = ::mmap(nullptr, 1 << 16, PROT_NONE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
  ASSERT_NE(hole, MAP_FAILED);
  auto errs = onThreads(n, [&](int r, const std::shared_ptr<Store>& store) {
    GroupOptions o = optionsFor(r, n, store);
    o.commRanks = {5, 7};
    auto g = connectOrFail(o);
    std::vector<char> buf(4096, 'x'), got(4096);
    g->beginOp(3, envelope(), soon());
    g->publishBuffers(r == 1 ? hole : buf.data(), buf.size(), buf.data(), buf.size());
    g->sync();
    // Member 1 could not read its own input: every member learns it (and
    // the allreduce would take the slots); read anyway, for the error.
    EXPECT_FALSE(g->publishedReadable());
    if (r == 0) {
      try {
        g->readPeer(1, Group::Buffer::kIn, 0, got.data(), got.size());
        ADD_FAILURE() << "read an unmapped buffer";
      } catch (const Error& e) {
        EXPECT_EQ(e.code(), ErrorCode::kInternal);
        EXPECT_EQ(e.context().peer, 7);
        EXPECT_EQ(e.context().rank, 5);
        EXPECT_NE(std::string(e.what()).find("input buffer of rank 7"), std::string::npos)
            << e.what();
      }
      ASSERT_TRUE(g->error() != nullptr);
      g->readPeer(1, Group::Buffer::kOut, 0, got.data(), got.size());  // still readable
      EXPECT_EQ(got[4095], 'x');
      g->notifyPeers(*g->error());  // what the communicator does with a failed op
    } else {
      try {
        g->sync();
        ADD_FAILURE() << "member 1 finished the op";
      } catch (const Error& e) {
        EXPECT_EQ(e.context().peer, 5) << e.what();
        EXPECT_NE(std::string(e.what()).find("rank 5 failed"), std::string::npos) << e.what();
      }
    }
  });
  testing::expectNoErrors(errs);
  ::munmap(hole, 1 << 16);
}

// ---- liveness -----------------------------------------------------------

// Member 0's side of the liveness tests: op 1 with a 200 ms deadline, whose
// first sync must fail (member 1 never syncs); returns that error.
Error syncThatFails(Group& g) {
  g.beginOp(1, envelope(), Deadline::after(std::chrono::milliseconds(200)));
  try {
    g.sync();
  } catch (const Error& e) {
    return e;
  }
  ADD_FAILURE() << "member 0 finished the op without member 1";
  return Error(ErrorCode::kInternal, "no error", ErrorContext{});
}

// Member 1 starts the op but never syncs. Member 0's wait passes its
// deadline and probes: a member 1 that answers (as its waits on another
// transport do through the hook) is alive but waiting itself; one that does
// not answer is stalled. Either way the timeout names member 1 (rank 7), and
// member 0's sleeping wait ran its own hook.
TEST(ShmLiveness, TheTimeoutSaysWhetherTheMemberAnswersTheProbe) {
  for (bool answers : {true, false}) {
    std::atomic<bool> done{false};
    std::atomic<int> hookRuns{0};
    auto errs = onThreads(2, [&](int r, const std::shared_ptr<Store>& store) {
      GroupOptions o = optionsFor(r, 2, store);
      o.commRanks = {5, 7};
      o.timeout = std::chrono::milliseconds(400);  // a grace of 100 ms
      auto g = connectOrFail(o);
      if (r == 0) {
        g->setWhileWaiting([&] { ++hookRuns; });
        const Error e = syncThatFails(*g);
        EXPECT_EQ(e.code(), ErrorCode::kTimeout) << e.what();
        EXPECT_EQ(e.context().peer, 7) << e.what();
        const std::string want =
            answers ? "rank 7 is alive but waiting itself" : "rank 7 is not responding";
        EXPECT_NE(std::string(e.what()).find(want), std::string::npos) << e.what();
        done = true;
        return;
      }
      g->beginOp(1, envelope(), soon());
      while (!done) {
        if (answers) g->answerProbes();
        std::this_thread::sleep_for(std::chrono::milliseconds(5));
      }
    });
    testing::expectNoErrors(errs);
    EXPECT_GT(hookRuns.load(), 0);
  }
}

// Member 1 waits elsewhere and reports the failure it ran into as soon as
// member 0's probe reaches it: member 0 raises that report (naming the
// stalled rank behind member 1), not a timeout blaming member 1.
TEST(ShmLiveness, TheReportOfAMemberThatWaitsItselfWinsOverTheTimeout) {
  std::atomic<bool> done{false};
  auto errs = onThreads(2, [&](int r, const std::shared_ptr<Store>& store) {
    GroupOptions o = optionsFor(r, 2, store);
    o.timeout = std::chrono::milliseconds(400);
    auto g = connectOrFail(o);
    if (r == 0) {
      const Error e = syncThatFails(*g);
      EXPECT_EQ(e.code(), ErrorCode::kTimeout) << e.what();
      const std::string what = e.what();
      EXPECT_NE(what.find("rank 1 failed"), std::string::npos) << what;
      EXPECT_NE(what.find("rank 9 stalled"), std::string::npos) << what;
      done = true;
      return;
    }
    g->beginOp(1, envelope(), soon());
    while (!done && !g->answerProbes()) std::this_thread::sleep_for(std::chrono::milliseconds(1));
    if (!done) g->notifyPeers(Error(ErrorCode::kTimeout, "rank 9 stalled", ErrorContext{}));
    while (!done) std::this_thread::sleep_for(std::chrono::milliseconds(1));
  });
  testing::expectNoErrors(errs);
}

// A member that publishes what is not a gflow segment (text that is no
// description, or an unsealed memfd of the right size) is refused: every
// member falls back, and the reason names the member. What proves a
// segment is the description's fd opening through /proc/<pid>/fd as a
// sealed memfd of the agreed size that holds gflow's magic and the
// published nonce (group.cc, mapPeer).
TEST(ShmGroupClaims, ASegmentThatIsNotGflowsIsRefusedNamingItsMember) {
  for (bool asText : {true, false}) {
    std::string why = "(connected)";
    std::atomic<bool> done{false};
    auto errs = onThreads(2, [&](int rank, const std::shared_ptr<Store>& store) {
      if (rank == 0) {
        if (Group::connect(optionsFor(0, 2, store), &why)) why = "(connected)";
        done = true;
        return;
      }
      std::istringstream real(store->getString("t/shm/seg/0", std::chrono::seconds(20)));
      long pid = 0;
      int fd = -1;
      uint64_t nonce = 0, total = 0;
      real >> pid >> fd >> nonce >> total;
      const int mfd = ::memfd_create("not-gflow", MFD_CLOEXEC);
      ASSERT_GE(mfd, 0);
      ASSERT_EQ(::ftruncate(mfd, static_cast<off_t>(total)), 0);
      std::ostringstream mine;
      mine << ::getpid() << " " << mfd << " " << nonce << " " << total << " 0";
      store->setString("t/shm/seg/1", asText ? "not a segment" : mine.str());
      store->setString("t/shm/ok/1", "1r");
      while (!done) std::this_thread::sleep_for(std::chrono::milliseconds(1));
      ::close(mfd);
    });
    testing::expectNoErrors(errs);
    EXPECT_THAT(why, ::testing::HasSubstr("local rank 1")) << why;
    EXPECT_NE(why, "(connected)");
  }
}

}  // namespace
}  // namespace gflow::backend::shm
