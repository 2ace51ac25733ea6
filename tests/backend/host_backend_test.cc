// The host backend (src/backend/host/) driven directly, without a
// Communicator: one host backend per rank over loopback TCP contexts, ranks
// as threads. Every result is checked against an independent reference
// (exact small integers in every dtype, or float64) and must be bitwise the
// same on every rank; no op may write past its output.
//
// The test binary's ring tuning (tests/testing/test_env.cc: 1 KiB pieces,
// windows of 3) makes a few thousand elements span several pieces and rounds.
#include <gtest/gtest.h>

#include <cmath>
#include <string>
#include <vector>

#include "backend/backend.h"
#include "backend/collective_checks.h"
#include "backend/loopback.h"
#include "testing/values.h"

namespace gflow {
namespace {

using backend::Algorithm;
using backend::Backend;
using backend::Op;
using backend::OpKind;
using testing::BackendWorld;

constexpr Algorithm kAllreduceAlgorithms[] = {Algorithm::kRing, Algorithm::kRecursiveDoubling,
                                              Algorithm::kHalvingDoubling, Algorithm::kFixedOrder};
using testing::opDesc;
using testing::RankBuffers;

// Element counts for a world of n: empty, one element, fewer than n, not a
// multiple of n, and enough for several pieces and ring rounds.
std::vector<size_t> allreduceCounts(int n) {
  std::vector<size_t> c = {0, 1};
  if (n > 2) c.push_back(static_cast<size_t>(n - 1));
  c.push_back(static_cast<size_t>(2 * n + 1));
  c.push_back(9001);
  return c;
}

class HostBackendTest : public ::testing::TestWithParam<int> {
 protected:
  void SetUp() override { world_ = std::make_unique<BackendWorld>(BackendWorld::host(GetParam())); }
  int n() const { return GetParam(); }

  // Every dtype, op and count of allreduceCounts with `algo`.
  void checkEveryAllreduce(Algorithm algo) {
    for (DataType t : testing::allDataTypes()) {
      for (ReduceOp rop : testing::allReduceOps()) {
        if (!supportsReduceOp(t, rop)) continue;
        for (size_t count : allreduceCounts(n())) {
          testing::checkExactAllreduce(*world_, opDesc(OpKind::kAllreduce, t, rop, algo, count),
                                       false);
          if (HasFailure()) return;
        }
      }
    }
  }

  std::unique_ptr<BackendWorld> world_;
};

TEST_P(HostBackendTest, RingAllreduceIsExactForEveryDtypeOpAndCount) {
  checkEveryAllreduce(Algorithm::kRing);
}

TEST_P(HostBackendTest, RecursiveDoublingAllreduceIsExactForEveryDtypeOpAndCount) {
  checkEveryAllreduce(Algorithm::kRecursiveDoubling);
}

TEST_P(HostBackendTest, HalvingDoublingAllreduceIsExactForEveryDtypeOpAndCount) {
  checkEveryAllreduce(Algorithm::kHalvingDoubling);
}

TEST_P(HostBackendTest, FixedOrderAllreduceIsExactForEveryDtypeOpAndCount) {
  checkEveryAllreduce(Algorithm::kFixedOrder);
}

TEST_P(HostBackendTest, AllreduceInPlace) {
  for (Algorithm algo : kAllreduceAlgorithms) {
    for (ReduceOp rop : {ReduceOp::kSum, ReduceOp::kAvg, ReduceOp::kMax}) {
      for (size_t count : {size_t(1), size_t(2 * n() + 1), size_t(9001)}) {
        testing::checkExactAllreduce(
            *world_, opDesc(OpKind::kAllreduce, DataType::kFloat32, rop, algo, count), true);
        if (HasFailure()) return;
      }
    }
  }
}

// Values distinct per rank and element, summed and averaged exactly.
TEST_P(HostBackendTest, AllreduceOfDistinctValuesMatchesClosedForm) {
  for (Algorithm algo : kAllreduceAlgorithms) {
    for (DataType t : {DataType::kFloat64, DataType::kInt32}) {
      for (ReduceOp rop : {ReduceOp::kSum, ReduceOp::kAvg}) {
        testing::checkDistinctAllreduce(*world_, opDesc(OpKind::kAllreduce, t, rop, algo, 4099));
        if (HasFailure()) return;
      }
    }
  }
}

// Inexact float32 sums: the ranks reduce different segments in different
// orders, yet every rank must end with the same bits, close to the float64
// sum.
TEST_P(HostBackendTest, InexactFloatSumsAreBitwiseIdenticalOnEveryRank) {
  const size_t count = 5003;
  for (Algorithm algo : kAllreduceAlgorithms) {
    RankBuffers in(n(), count * sizeof(float)), out(n(), count * sizeof(float));
    std::vector<double> want(count, 0.0);
    for (int r = 0; r < n(); ++r) {
      for (size_t i = 0; i < count; ++i) {
        const float v = 1.0f / static_cast<float>(3 + r * 7 + i % 13) + 0.1f * r;
        reinterpret_cast<float*>(in[r])[i] = v;
        want[i] += v;
      }
    }
    const Op op =
        world_->op(opDesc(OpKind::kAllreduce, DataType::kFloat32, ReduceOp::kSum, algo, count));
    ASSERT_TRUE(world_->run([&](int r, Backend& b) { b.allreduce(op, in[r], out[r]); }));
    out.expectIdentical();
    for (size_t i = 0; i < count; ++i) {
      const double got = reinterpret_cast<const float*>(out[0])[i];
      ASSERT_NEAR(got, want[i], 1e-5 * std::fabs(want[i]) * n()) << "element " << i;
    }
  }
}

TEST_P(HostBackendTest, ReduceScatterIsExactForEveryDtypeAndOp) {
  for (DataType t : testing::allDataTypes()) {
    for (ReduceOp rop : testing::allReduceOps()) {
      if (!supportsReduceOp(t, rop)) continue;
      for (size_t block : {size_t(0), size_t(1), size_t(3), size_t(1001)}) {
        for (Algorithm algo : {Algorithm::kRing, Algorithm::kFixedOrder}) {
          testing::checkExactReduceScatter(*world_,
                                           opDesc(OpKind::kReduceScatter, t, rop, algo, block));
          if (HasFailure()) return;
        }
      }
    }
  }
}

TEST_P(HostBackendTest, AllgatherPlacesEveryRanksBlock) {
  for (DataType t : testing::allDataTypes()) {
    for (size_t block : {size_t(0), size_t(1), size_t(3), size_t(1001)}) {
      for (bool inPlace : {false, true}) {
        testing::checkAllgather(
            *world_, opDesc(OpKind::kAllgather, t, ReduceOp::kSum, Algorithm::kRing, block),
            inPlace);
        if (HasFailure()) return;
      }
    }
  }
}

TEST_P(HostBackendTest, ChainBroadcastFromEveryRoot) {
  for (int root = 0; root < n(); ++root) {
    for (DataType t :
         {DataType::kFloat32, DataType::kFloat16, DataType::kFloat64, DataType::kUInt8}) {
      for (size_t count : {size_t(0), size_t(1), size_t(5), size_t(3001)}) {
        testing::checkBroadcast(
            *world_, opDesc(OpKind::kBroadcast, t, ReduceOp::kSum, Algorithm::kChain, count, root));
        if (HasFailure()) return;
      }
    }
  }
}

TEST_P(HostBackendTest, DisseminationBarrierHoldsEveryRankUntilAllArrive) {
  testing::checkBarrier(
      *world_,
      opDesc(OpKind::kBarrier, DataType::kFloat32, ReduceOp::kSum, Algorithm::kDissemination, 0),
      20);
}

// Empty ops may come with no memory at all (a null tensor of 0 elements).
TEST_P(HostBackendTest, EmptyOpsAcceptNullBuffers) {
  const auto f32 = DataType::kFloat32;
  std::vector<Op> ops;
  for (Algorithm algo : kAllreduceAlgorithms) {
    ops.push_back(world_->op(opDesc(OpKind::kAllreduce, f32, ReduceOp::kAvg, algo, 0)));
  }
  ops.push_back(
      world_->op(opDesc(OpKind::kReduceScatter, f32, ReduceOp::kAvg, Algorithm::kRing, 0)));
  ops.push_back(world_->op(opDesc(OpKind::kAllgather, f32, ReduceOp::kSum, Algorithm::kRing, 0)));
  ops.push_back(world_->op(opDesc(OpKind::kBroadcast, f32, ReduceOp::kSum, Algorithm::kChain, 0)));
  EXPECT_TRUE(world_->run([&](int, Backend& b) {
    for (const Op& o : ops) {
      switch (o.desc.kind) {
        case OpKind::kAllreduce: b.allreduce(o, nullptr, nullptr); break;
        case OpKind::kReduceScatter: b.reduceScatter(o, nullptr, nullptr); break;
        case OpKind::kAllgather: b.allgather(o, nullptr, nullptr); break;
        default: b.broadcast(o, nullptr); break;
      }
    }
  }));
}

// Ops of every kind, one after another on the same contexts (each op is its
// own tag group; nothing of one leaks into the next).
TEST_P(HostBackendTest, MixedOpsInSequence) {
  const size_t count = 777, block = count / n();
  const auto i32 = DataType::kInt32;
  std::vector<std::vector<int32_t>> a(n(), std::vector<int32_t>(count));
  std::vector<std::vector<int32_t>> all(n(), std::vector<int32_t>(n() * count));
  std::vector<std::vector<int32_t>> rsOut(n(), std::vector<int32_t>(block));
  for (int r = 0; r < n(); ++r) {
    for (size_t i = 0; i < count; ++i) a[r][i] = r * 1000 + int(i);
  }
  const Op ar =
      world_->op(opDesc(OpKind::kAllreduce, i32, ReduceOp::kMax, Algorithm::kRing, count));
  const Op ag =
      world_->op(opDesc(OpKind::kAllgather, i32, ReduceOp::kSum, Algorithm::kRing, count));
  const Op bc = world_->op(
      opDesc(OpKind::kBroadcast, i32, ReduceOp::kSum, Algorithm::kChain, count, n() - 1));
  const Op rs =
      world_->op(opDesc(OpKind::kReduceScatter, i32, ReduceOp::kSum, Algorithm::kRing, block));
  const Op rd = world_->op(
      opDesc(OpKind::kAllreduce, i32, ReduceOp::kMin, Algorithm::kRecursiveDoubling, count));
  ASSERT_TRUE(world_->run([&](int r, Backend& b) {
    b.allreduce(ar, a[r].data(), a[r].data());            // (n-1)*1000 + i
    b.allgather(ag, a[r].data(), all[r].data());          // n copies of that
    b.broadcast(bc, a[r].data());                         // unchanged: ranks agree
    b.reduceScatter(rs, all[r].data(), rsOut[r].data());  // n * ((n-1)*1000 + i)
    b.allreduce(rd, a[r].data(), a[r].data());            // unchanged
  }));
  for (int r = 0; r < n(); ++r) {
    for (size_t i = 0; i < count; ++i) ASSERT_EQ(a[r][i], (n() - 1) * 1000 + int(i)) << r;
    for (size_t i = 0; i < block; ++i) {
      ASSERT_EQ(rsOut[r][i], n() * ((n() - 1) * 1000 + int(r * block + i))) << "rank " << r;
    }
  }
}

INSTANTIATE_TEST_SUITE_P(Ranks, HostBackendTest, ::testing::Values(1, 2, 3, 4, 5),
                         [](const ::testing::TestParamInfo<int>& p) {
                           return "n" + std::to_string(p.param);
                         });

}  // namespace
}  // namespace gflow
