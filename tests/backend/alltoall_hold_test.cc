// The pairwise all-to-all over TCP (backend/host/alltoall_pairwise.cc) posts
// every receive before its first send and says so to the transport
// (Context::receivesPostedFirst): a rank that runs ahead then holds its
// blocks from the point-to-point size (GFLOW_RENDEZVOUS, 64 KiB in the
// tests) until its peer posts, so the lagging peer never stages them. A
// block of 100 KB is below the collectives' threshold (16 x 64 KiB), so
// without the hint it would go at once and be staged.
#include <gtest/gtest.h>

#include <atomic>
#include <chrono>
#include <cstring>
#include <thread>
#include <vector>

#include "backend/collective_checks.h"
#include "backend/loopback.h"
#include "transport/engine.h"

namespace gflow {
namespace {

using backend::Algorithm;
using backend::OpKind;

TEST(HostAlltoall, ARankAheadHoldsItsBlocksUntilThePeerPosts) {
  constexpr size_t kBlock = 100000;  // bytes per pair
  auto store = createHashStore();
  std::vector<transport::Engine*> engines(2);
  std::vector<std::unique_ptr<backend::Backend>> backends(2);
  auto errors = testing::onRankThreads(2, [&](int r) {
    auto ctx = transport::createContext(
        "tcp", testing::loopbackOptions(r, 2, store, "a2a/", std::chrono::seconds(30)));
    engines[r] = dynamic_cast<transport::Engine*>(ctx.get());
    backends[r] = backend::createHostBackend(std::move(ctx));
  });
  for (auto& e : errors) ASSERT_FALSE(e);
  ASSERT_TRUE(engines[0] && engines[1]);

  backend::Op op;
  op.seq = 1;
  op.desc = testing::opDesc(OpKind::kAlltoall, DataType::kUInt8, ReduceOp::kSum,
                            Algorithm::kPairwise, kBlock);
  op.deadline = Deadline::after(std::chrono::seconds(30));
  std::atomic<bool> started{false};
  uint64_t staged = 0;
  std::vector<std::vector<char>> in(2), out(2, std::vector<char>(2 * kBlock, 0));
  for (int r = 0; r < 2; ++r) in[r] = testing::pattern(2 * kBlock, 20 + r);
  errors = testing::onRankThreads(2, [&](int r) {
    if (r == 1) {  // behind: rank 0's block arrives before this rank posts
      while (!started) std::this_thread::yield();
      for (int i = 0; i < 100; ++i) {
        engines[1]->poll();
        std::this_thread::sleep_for(std::chrono::milliseconds(1));
      }
      staged = engines[1]->stagedBytes(0);
    } else {
      started = true;
    }
    backends[r]->alltoall(op, in[r].data(), out[r].data());
  });
  for (auto& e : errors) ASSERT_FALSE(e);
  EXPECT_LE(staged, transport::kStagedOverhead) << "the block of the rank ahead came early";
  for (int r = 0; r < 2; ++r) {
    for (int from = 0; from < 2; ++from) {
      EXPECT_EQ(0, std::memcmp(out[r].data() + from * kBlock, in[from].data() + r * kBlock, kBlock))
          << "rank " << r << ", block from " << from;
    }
  }
}

}  // namespace
}  // namespace gflow
