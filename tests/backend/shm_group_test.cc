// shm::Group's single-copy reads (backend/shm/group.h): members agree on
// whether they can read each other's memory, read the buffers a member
// published, and a buffer that cannot be read is an error naming its owner.
// The allreduce that uses them is checked against exact sums with every
// other collective test (tests/testing/test_env.cc sends 16 KiB and more
// through it at every group size).
#include <gtest/gtest.h>

#include <sys/mman.h>

#include <numeric>
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

}  // namespace
}  // namespace gflow::backend::shm
