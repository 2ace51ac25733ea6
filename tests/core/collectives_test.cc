// Reduce-scatter, allgather, broadcast and barrier against exact references.
#include <gtest/gtest.h>

#include <cstring>

#include "gflow/gflow.h"
#include "testing/ranks.h"
#include "testing/values.h"

namespace gflow {
namespace {

class CollectivesWorld : public ::testing::TestWithParam<int> {};

TEST_P(CollectivesWorld, ReduceScatterEveryDtypeOp) {
  const int n = GetParam();
  auto world = testing::makeWorld(n);
  testing::forEachRank(world, [&](Communicator& c) {
    for (DataType t : testing::allDataTypes()) {
      const size_t es = dataTypeSize(t);
      for (ReduceOp op : testing::allReduceOps()) {
        if (!supportsReduceOp(t, op)) continue;
        for (size_t block : {size_t(0), size_t(1), size_t(5), size_t(1037)}) {
          const size_t total = block * n;
          std::vector<char> in(total * es + 1), out(block * es + 1);
          for (size_t i = 0; i < total; ++i) {
            testing::setValue(in.data(), i, t, testing::exactInput(c.rank(), i, op, t));
          }
          c.reduceScatter(Tensor(in.data(), total, t), Tensor(out.data(), block, t), op);
          for (size_t i = 0; i < block; ++i) {
            const size_t g = c.rank() * block + i;
            ASSERT_EQ(testing::getValue(out.data(), i, t), testing::exactExpected(n, g, op, t))
                << toString(t) << " " << toString(op) << " block " << block << " i " << i;
          }
        }
      }
    }
  });
}

TEST_P(CollectivesWorld, AllgatherInPlaceAndOutOfPlace) {
  const int n = GetParam();
  auto world = testing::makeWorld(n);
  testing::forEachRank(world, [&](Communicator& c) {
    for (size_t block : {size_t(0), size_t(1), size_t(3), size_t(2500)}) {
      for (bool inPlace : {false, true}) {
        std::vector<int64_t> out(block * n, -1), in(block);
        for (size_t i = 0; i < block; ++i) in[i] = c.rank() * 1000003 + static_cast<int64_t>(i);
        if (inPlace) {
          if (block > 0)
            std::memcpy(out.data() + c.rank() * block, in.data(), block * sizeof(int64_t));
          c.allgather(tensor(out.data() + c.rank() * block, block), tensor(out.data(), out.size()));
        } else {
          c.allgather(tensor(in.data(), block), tensor(out.data(), out.size()));
        }
        for (int r = 0; r < n; ++r) {
          for (size_t i = 0; i < block; ++i) {
            ASSERT_EQ(out[r * block + i], r * 1000003 + static_cast<int64_t>(i));
          }
        }
      }
    }
  });
}

TEST_P(CollectivesWorld, BroadcastFromEveryRoot) {
  const int n = GetParam();
  auto world = testing::makeWorld(n);
  testing::forEachRank(world, [&](Communicator& c) {
    for (int root = 0; root < n; ++root) {
      for (size_t count : {size_t(0), size_t(1), size_t(777), size_t(20000)}) {
        std::vector<double> v(count, -1.0);
        if (c.rank() == root) {
          for (size_t i = 0; i < count; ++i) v[i] = root * 0.5 + static_cast<double>(i);
        }
        c.broadcast(tensor(v.data(), count), root);
        for (size_t i = 0; i < count; ++i) ASSERT_EQ(v[i], root * 0.5 + static_cast<double>(i));
      }
    }
  });
}

TEST_P(CollectivesWorld, BarrierOrdersSideEffects) {
  const int n = GetParam();
  auto world = testing::makeWorld(n);
  std::atomic<int> arrived{0};
  testing::forEachRank(world, [&](Communicator& c) {
    for (int round = 1; round <= 5; ++round) {
      arrived.fetch_add(1);
      c.barrier();
      // Nobody leaves round k before everyone arrived in round k.
      ASSERT_GE(arrived.load(), round * n);
      c.barrier();
    }
  });
}

INSTANTIATE_TEST_SUITE_P(Worlds, CollectivesWorld, ::testing::Values(1, 2, 3, 4, 5, 8));

TEST(Stats, CountsOpsAndBytesPerPeer) {
  testing::runRanks(2, [](Communicator& c) {
    std::vector<float> v(1000, 1.0f);
    Stats before = c.stats();
    c.allreduce(tensor(v.data(), v.size()));
    c.barrier();
    Stats s = c.stats();
    EXPECT_EQ(s.allreduce, before.allreduce + 1);
    EXPECT_EQ(s.barrier, before.barrier + 1);
    const int peer = 1 - c.rank();
    // Two ranks: recursive doubling or ring move 4000 bytes each way.
    EXPECT_GE(s.peers[peer].bytesSent - before.peers[peer].bytesSent, 4000u);
    EXPECT_GE(s.peers[peer].bytesReceived - before.peers[peer].bytesReceived, 4000u);
    EXPECT_EQ(s.peers[c.rank()].bytesSent, 0u);
    EXPECT_EQ(s.bytesSent(), s.peers[peer].bytesSent);
  });
}

TEST(Split, EvenOddGroupsReduceSeparately) {
  testing::runRanks(5, [](Communicator& c) {
    auto sub = c.split(c.rank() % 2, -c.rank());  // reversed order inside each group
    ASSERT_NE(sub, nullptr);
    const int groupSize = (c.rank() % 2 == 0) ? 3 : 2;
    ASSERT_EQ(sub->size(), groupSize);
    // key = -rank: the highest parent rank gets sub-rank 0.
    int expectRank = 0;
    for (int r = c.rank() + 2; r < 5; r += 2) ++expectRank;
    EXPECT_EQ(sub->rank(), expectRank);
    int64_t v = c.rank();
    sub->allreduce(tensor(&v, 1), ReduceOp::kSum);
    EXPECT_EQ(v, c.rank() % 2 == 0 ? 0 + 2 + 4 : 1 + 3);
    EXPECT_EQ(sub->localSize(), groupSize);  // all threads share one host
    // The parent keeps working after the split.
    int64_t w = 1;
    c.allreduce(tensor(&w, 1));
    EXPECT_EQ(w, 5);
  });
}

TEST(Split, NegativeColorOptsOut) {
  testing::runRanks(3, [](Communicator& c) {
    auto sub = c.split(c.rank() == 1 ? -1 : 7, 0);
    if (c.rank() == 1) {
      EXPECT_EQ(sub, nullptr);
    } else {
      ASSERT_NE(sub, nullptr);
      EXPECT_EQ(sub->size(), 2);
      sub->barrier();
    }
  });
}

TEST(Communicator, LocalRankFromHostGrouping) {
  testing::runRanks(3, [](Communicator& c) {
    EXPECT_EQ(c.localSize(), 3);
    EXPECT_EQ(c.localRank(), c.rank());
  });
}

}  // namespace
}  // namespace gflow
