// Allreduce across world sizes, algorithms, dtypes, ops, counts, in-place and
// out-of-place, against exact references; plus random float data against a
// float64 reference with bitwise agreement across ranks.
#include <gtest/gtest.h>

#include <cmath>
#include <cstring>
#include <random>
#include <string>

#include "backend/route_policy.h"
#include "common/params.h"
#include "gflow/gflow.h"
#include "testing/ranks.h"
#include "testing/values.h"

namespace gflow {
namespace {

using testing::allDataTypes;
using testing::allReduceOps;

class AllreduceWorld : public ::testing::TestWithParam<std::tuple<int, const char*>> {};

// "ring", "rd", "hd": that algorithm over the network transport;
// "fixed_shm" / "fixed_net": reproducible mode on shared memory / over the
// network transport.
Options worldOptions(const std::string& algo) {
  Options o;
  if (algo.rfind("fixed", 0) == 0) {
    o.reproducible = true;
    o.shm.enabled = algo == "fixed_shm";
  } else {
    o.algorithm = algo;
  }
  return o;
}

TEST_P(AllreduceWorld, ExactEveryDtypeOpCount) {
  const int n = std::get<0>(GetParam());
  Options o = worldOptions(std::get<1>(GetParam()));
  o.timeout = std::chrono::seconds(60);
  auto world = testing::makeWorld(n, o);
  const std::vector<size_t> counts = {0, 1, 2, static_cast<size_t>(n) + 1, 7, 1000, 4099};
  testing::forEachRank(world, [&](Communicator& c) {
    for (DataType t : allDataTypes()) {
      const size_t es = dataTypeSize(t);
      for (ReduceOp op : allReduceOps()) {
        if (!supportsReduceOp(t, op)) continue;
        for (size_t count : counts) {
          for (bool inPlace : {true, false}) {
            std::vector<char> in(count * es + 1), out(count * es + 1);
            for (size_t i = 0; i < count; ++i) {
              testing::setValue(in.data(), i, t, testing::exactInput(c.rank(), i, op, t));
            }
            std::vector<char> inCopy = in;
            if (inPlace) {
              c.allreduce(Tensor(in.data(), count, t), op);
            } else {
              c.allreduce(Tensor(in.data(), count, t), Tensor(out.data(), count, t), op);
              ASSERT_EQ(0, std::memcmp(in.data(), inCopy.data(), in.size()))
                  << "out-of-place allreduce modified its input";
            }
            const char* res = inPlace ? in.data() : out.data();
            size_t wrong = 0;
            size_t firstWrong = 0;
            for (size_t i = 0; i < count; ++i) {
              if (testing::getValue(res, i, t) != testing::exactExpected(n, i, op, t)) {
                if (wrong++ == 0) firstWrong = i;
              }
            }
            ASSERT_EQ(wrong, 0u) << toString(t) << " " << toString(op) << " count=" << count
                                 << (inPlace ? " in-place" : " out-of-place") << " rank "
                                 << c.rank() << ": first wrong index " << firstWrong << " got "
                                 << testing::getValue(res, firstWrong, t) << " want "
                                 << testing::exactExpected(n, firstWrong, op, t);
          }
        }
      }
    }
  });
}

TEST_P(AllreduceWorld, RandomFloatsMatchFloat64AndAgreeBitwise) {
  const int n = std::get<0>(GetParam());
  auto world = testing::makeWorld(n, worldOptions(std::get<1>(GetParam())));
  const size_t count = 30011;
  std::vector<std::vector<float>> inputs(n), outputs(n);
  for (int r = 0; r < n; ++r) {
    std::mt19937 gen(1234 + r);
    std::uniform_real_distribution<float> dist(-1.0f, 1.0f);
    inputs[r].resize(count);
    for (auto& x : inputs[r]) x = dist(gen);
  }
  testing::forEachRank(world, [&](Communicator& c) {
    std::vector<float> buf = inputs[c.rank()];
    c.allreduce(tensor(buf.data(), buf.size()), ReduceOp::kSum);
    outputs[c.rank()] = buf;
  });
  for (size_t i = 0; i < count; ++i) {
    double ref = 0, mag = 0;
    for (int r = 0; r < n; ++r) {
      ref += inputs[r][i];
      mag += std::fabs(inputs[r][i]);
    }
    // n-1 float32 additions, each off by at most half an ulp of a partial sum.
    const double bound = n * std::ldexp(1.0, -24) * mag + 1e-30;
    ASSERT_LE(std::fabs(outputs[0][i] - ref), bound) << "element " << i;
  }
  for (int r = 1; r < n; ++r) {
    ASSERT_EQ(0, std::memcmp(outputs[0].data(), outputs[r].data(), count * sizeof(float)))
        << "rank " << r << " differs from rank 0 bitwise";
  }
}

INSTANTIATE_TEST_SUITE_P(Worlds, AllreduceWorld,
                         ::testing::Combine(::testing::Values(1, 2, 3, 4, 5, 8),
                                            ::testing::Values("ring", "rd", "hd", "fixed_shm",
                                                              "fixed_net")),
                         [](const ::testing::TestParamInfo<std::tuple<int, const char*>>& p) {
                           return "n" + std::to_string(std::get<0>(p.param)) + "_" +
                                  std::get<1>(p.param);
                         });

TEST(Allreduce, AutoSelectionCrossesThresholdCorrectly) {
  // Sizes on both sides of the recursive-doubling and halving-doubling
  // thresholds with the default selection.
  auto world = testing::makeWorld(3);
  testing::forEachRank(world, [&](Communicator& c) {
    const size_t edge = backend::RoutePolicy::defaultRdMaxBytes(3) / sizeof(int32_t);
    const size_t hd = backend::RoutePolicy::defaultHdMaxBytes(3) / sizeof(int32_t);
    for (size_t count : {size_t(10), edge - 1, edge, edge + 1, 3 * edge, hd, hd + 1}) {
      std::vector<int32_t> v(count);
      for (size_t i = 0; i < count; ++i) v[i] = static_cast<int32_t>(i % 97) + c.rank();
      c.allreduce(tensor(v.data(), count), ReduceOp::kSum);
      for (size_t i = 0; i < count; ++i) {
        ASSERT_EQ(v[i], 3 * static_cast<int32_t>(i % 97) + 3) << "count " << count << " i " << i;
      }
    }
  });
}

TEST(Allreduce, DefaultCommunicatorFreeFunction) {
  testing::runRanks(1, [](Communicator&) {
    Options o;
    o.rank = 0;
    o.size = 1;
    o.store = createHashStore();
    init(o);
    std::vector<float> v = {1, 2, 3};
    allreduce(tensor(v.data(), v.size()), ReduceOp::kMax);
    EXPECT_EQ(v[2], 3.0f);
    finalize();
    EXPECT_THROW(allreduce(tensor(v.data(), v.size())), Error);
  });
}

}  // namespace
}  // namespace gflow

namespace gflow {
namespace {

TEST(Allreduce, CountBeyondInt32) {
  // 2^31 + 17 uint8 elements per rank: every index and byte count must be
  // 64-bit. Larger pieces than the test default keep the message count sane.
  setenv("GFLOW_PIECE_BYTES", "4M", 1);
  setenv("GFLOW_RING_WINDOW", "8", 1);
  params::resetCacheForTesting();
  const size_t count = (size_t(1) << 31) + 17;
  std::vector<std::vector<uint8_t>> bufs(2);
  testing::runRanks(2, [&](Communicator& c) {
    auto& v = bufs[c.rank()];
    v.assign(count, static_cast<uint8_t>(c.rank() + 1));
    v[count - 1] = static_cast<uint8_t>(10 * (c.rank() + 1));
    c.allreduce(tensor(v.data(), count), ReduceOp::kSum);
  });
  for (const auto& v : bufs) {
    ASSERT_EQ(v.size(), count);
    EXPECT_EQ(v[count - 1], 30);
    EXPECT_EQ(v[count - 2], 3);
    EXPECT_EQ(v[0], 3);
    EXPECT_EQ(v[size_t(1) << 31], 3);
    size_t wrong = 0;
    for (size_t i = 0; i + 1 < count; ++i) wrong += (v[i] != 3);
    EXPECT_EQ(wrong, 0u);
  }
}

TEST(Allreduce, RandomCounts) {
  std::mt19937 gen(20261130);
  std::uniform_int_distribution<size_t> dist(0, 50000);
  std::vector<size_t> counts(12);
  for (auto& c : counts) c = dist(gen);
  auto world = testing::makeWorld(3);
  testing::forEachRank(world, [&](Communicator& c) {
    for (size_t count : counts) {
      for (ReduceOp op : testing::allReduceOps()) {
        if (!supportsReduceOp(DataType::kFloat64, op)) continue;
        std::vector<double> v(count);
        for (size_t i = 0; i < count; ++i) {
          v[i] = testing::exactInput(c.rank(), i, op, DataType::kFloat64);
        }
        c.allreduce(tensor(v.data(), count), op);
        for (size_t i = 0; i < count; ++i) {
          ASSERT_EQ(v[i], testing::exactExpected(3, i, op, DataType::kFloat64))
              << "count " << count << " op " << toString(op) << " i " << i;
        }
      }
    }
  });
}

}  // namespace
}  // namespace gflow

namespace gflow {
namespace {

TEST(Allreduce, LogStepAvgLargeOddWorld) {
  // The folded rank's result is sent while the group divides for avg: the
  // division must happen before the send (a message larger than the socket
  // buffer is still being written when the sender moves on). Halving-doubling
  // also sends from `out` while it halves and receives there while it doubles.
  setenv("GFLOW_SOCKET_BUFFER", "64K", 1);  // small socket buffers: sends finish late
  params::resetCacheForTesting();
  for (const char* algo : {"rd", "hd"}) {
    Options o;
    o.algorithm = algo;
    testing::runRanks(
        3,
        [](Communicator& c) {
          const size_t count = 6u << 20;  // 24 MiB of float32
          std::vector<float> v(count);
          for (size_t i = 0; i < count; ++i) {
            v[i] = static_cast<float>(
                testing::exactInput(c.rank(), i, ReduceOp::kAvg, DataType::kFloat32));
          }
          c.allreduce(tensor(v.data(), count), ReduceOp::kAvg);
          for (size_t i = 0; i < count; ++i) {
            ASSERT_EQ(v[i], testing::exactExpected(3, i, ReduceOp::kAvg, DataType::kFloat32)) << i;
          }
        },
        o);
  }
  unsetenv("GFLOW_SOCKET_BUFFER");
  params::resetCacheForTesting();
}

}  // namespace
}  // namespace gflow
