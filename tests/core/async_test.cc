// Async ops: many in flight, issue order kept, errors surface through Work.
#include <gtest/gtest.h>

#include <thread>

#include "gflow/gflow.h"
#include "testing/ranks.h"

namespace gflow {
namespace {

TEST(Async, ManyInFlightCompleteInIssueOrder) {
  testing::runRanks(3, [](Communicator& c) {
    const int kOps = 40;
    std::vector<std::vector<int32_t>> bufs(kOps);
    std::vector<Work> works;
    for (int k = 0; k < kOps; ++k) {
      bufs[k].assign(100 + 37 * k, k + c.rank());
      works.push_back(c.allreduceAsync(tensor(bufs[k].data(), bufs[k].size())));
    }
    // A blocking call queues behind the async ones.
    int32_t x = 1;
    c.allreduce(tensor(&x, 1));
    EXPECT_EQ(x, 3);
    for (int k = 0; k < kOps; ++k) {
      works[k].wait();
      EXPECT_TRUE(works[k].test());
      for (int32_t v : bufs[k]) ASSERT_EQ(v, 3 * k + 3);
    }
  });
}

TEST(Async, MixedCollectivesAsync) {
  testing::runRanks(4, [](Communicator& c) {
    std::vector<float> a(5000, 1.0f), g(4 * 10), b(10, static_cast<float>(c.rank()));
    std::vector<float> rsIn(4 * 3, 1.0f), rsOut(3);
    std::vector<double> bc(100, c.rank() == 2 ? 9.0 : 0.0);
    Work w1 = c.allreduceAsync(tensor(a.data(), a.size()), ReduceOp::kAvg);
    Work w2 = c.allgatherAsync(tensor(b.data(), b.size()), tensor(g.data(), g.size()));
    Work w3 = c.reduceScatterAsync(tensor(rsIn.data(), rsIn.size()), tensor(rsOut.data(), 3));
    Work w4 = c.broadcastAsync(tensor(bc.data(), bc.size()), 2);
    Work w5 = c.barrierAsync();
    for (Work* w : {&w5, &w4, &w3, &w2, &w1}) w->wait();
    EXPECT_EQ(a[123], 1.0f);
    for (int r = 0; r < 4; ++r) EXPECT_EQ(g[r * 10 + 9], static_cast<float>(r));
    EXPECT_EQ(rsOut[2], 4.0f);
    EXPECT_EQ(bc[99], 9.0);
  });
}

TEST(Async, WaitWithDeadlineOnSlowPeer) {
  auto errors = testing::runRanksCollect(2, [](Communicator& c) {
    std::vector<float> v(10, 1.0f);
    if (c.rank() == 1) std::this_thread::sleep_for(std::chrono::milliseconds(400));
    Work w = c.allreduceAsync(tensor(v.data(), v.size()));
    if (c.rank() == 0) {
      // The peer is late: a short wait times out, the op keeps running.
      EXPECT_THROW(
          {
            try {
              w.wait(std::chrono::milliseconds(50));
            } catch (const Error& e) {
              EXPECT_EQ(e.code(), ErrorCode::kTimeout);
              throw;
            }
          },
          Error);
    }
    w.wait();
    EXPECT_EQ(v[0], 2.0f);
  });
  for (auto& e : errors) EXPECT_EQ(e, nullptr);
}

}  // namespace
}  // namespace gflow
