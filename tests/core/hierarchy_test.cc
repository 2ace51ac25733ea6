// Host grouping, the shared-memory backend and hierarchical collectives, with
// ranks as threads. Per-rank host ids (Options::hostId) let one process act
// as several hosts: ranks with the same id share memory, the others talk TCP.
#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include <algorithm>
#include <atomic>
#include <chrono>
#include <cstring>
#include <regex>
#include <string>
#include <thread>
#include <vector>

#include "gflow/gflow.h"
#include "testing/ranks.h"
#include "testing/values.h"

namespace gflow {
namespace {

using testing::exactExpected;
using testing::exactInput;
using testing::getValue;
using testing::setValue;

// Checks an allreduce of `count` elements against the exact reference.
void checkAllreduce(Communicator& c, size_t count, DataType t, ReduceOp op, bool inPlace) {
  const size_t es = dataTypeSize(t);
  std::vector<char> in(count * es + 1), out(count * es + 1, 0x5a);
  for (size_t i = 0; i < count; ++i) setValue(in.data(), i, t, exactInput(c.rank(), i, op, t));
  if (inPlace) {
    c.allreduce(Tensor(in.data(), count, t), op);
  } else {
    c.allreduce(Tensor(in.data(), count, t), Tensor(out.data(), count, t), op);
    for (size_t i = 0; i < count; ++i) {  // in is left untouched
      ASSERT_EQ(getValue(in.data(), i, t), exactInput(c.rank(), i, op, t));
    }
  }
  const char* res = inPlace ? in.data() : out.data();
  for (size_t i = 0; i < count; ++i) {
    ASSERT_EQ(getValue(res, i, t), exactExpected(c.size(), i, op, t))
        << "rank " << c.rank() << " " << toString(t) << " " << toString(op) << " count " << count
        << " i " << i << (inPlace ? " in-place" : " out-of-place");
  }
}

TEST(SharedMemory, OneHostRunsEveryCollectiveInSharedMemory) {
  auto world = testing::makeWorld(3);
  testing::forEachRank(world, [&](Communicator& c) {
    EXPECT_EQ(c.numHosts(), 1);
    EXPECT_EQ(c.hostIndex(), 0);
    std::vector<float> v(5000, 1.0f), all(3 * 5000);
    c.allreduce(tensor(v.data(), v.size()));
    EXPECT_EQ(v[4999], 3.0f);
    c.reduceScatter(tensor(all.data(), all.size()), tensor(v.data(), v.size()));
    c.allgather(tensor(v.data(), v.size()), tensor(all.data(), all.size()));
    c.broadcast(tensor(v.data(), v.size()), 2);
    c.barrier();
    Stats s = c.stats();
    EXPECT_EQ(s.sharedMemoryOps, 5u);
    EXPECT_EQ(s.networkOps, 0u);
    // Each op's route: the slots, or for the allreduce (20000 bytes, in the
    // test binary's GFLOW_SHM_SINGLE_COPY range of 16K-) single copy where
    // the kernel lets the ranks read each other.
    std::vector<std::string> routes;
    for (const Stats::Route& r : s.routes) {
      const bool single = r.op == "allreduce" && r.algorithm == "single-copy";
      routes.push_back(r.op + " " + r.path + " " + (single ? "slots" : r.algorithm) + " x" +
                       std::to_string(r.ops));
    }
    EXPECT_THAT(routes,
                ::testing::UnorderedElementsAre(
                    "allreduce shm slots x1", "reduce_scatter shm slots x1",
                    "allgather shm slots x1", "broadcast shm slots x1", "barrier shm slots x1"));
    // Peers read this rank's slots: the traffic shows up per peer.
    for (int p = 0; p < 3; ++p) {
      if (p == c.rank()) continue;
      EXPECT_GT(s.peers[p].bytesReceived, 0u) << "from rank " << p;
      EXPECT_GT(s.peers[p].bytesSent, 0u) << "to rank " << p;
    }
  });
}

TEST(SharedMemory, ForcedFlatAlgorithmUsesTheNetwork) {
  Options o;
  o.algorithm = "ring";
  auto world = testing::makeWorld(2, o);
  testing::forEachRank(world, [&](Communicator& c) {
    checkAllreduce(c, 3000, DataType::kFloat32, ReduceOp::kSum, true);
    EXPECT_EQ(c.stats().networkOps, 1u);
    EXPECT_EQ(c.stats().sharedMemoryOps, 0u);
    ASSERT_EQ(c.stats().routes.size(), 1u);
    const Stats::Route r = c.stats().routes[0];
    EXPECT_EQ(r.op + " " + r.path + " " + r.algorithm + " x" + std::to_string(r.ops),
              "allreduce network ring x1");
  });
}

TEST(SharedMemory, EveryDtypeAndOpAcrossChunkBoundaries) {
  for (int n : {2, 3, 4}) {
    auto world = testing::makeWorld(n);
    testing::forEachRank(world, [&](Communicator& c) {
      for (DataType t : testing::allDataTypes()) {
        for (ReduceOp op : testing::allReduceOps()) {
          if (!supportsReduceOp(t, op)) continue;
          for (size_t count : {size_t(0), size_t(1), size_t(7), size_t(3001), size_t(9000)}) {
            checkAllreduce(c, count, t, op, count % 2 == 1);
          }
        }
      }
      EXPECT_EQ(c.stats().networkOps, 0u);
    });
  }
}

TEST(SharedMemory, TimeoutNamesTheMissingRank) {
  Options o;
  o.timeout = std::chrono::milliseconds(400);
  auto errors = testing::runRanksCollect(
      3,
      [](Communicator& c) {
        if (c.rank() == 2) return;  // never joins the op
        std::vector<float> v(100, 1.0f);
        c.allreduce(tensor(v.data(), v.size()));
      },
      o);
  for (int r : {0, 1}) {
    ASSERT_TRUE(errors[r]) << "rank " << r;
    try {
      std::rethrow_exception(errors[r]);
    } catch (const Error& e) {
      EXPECT_TRUE(e.code() == ErrorCode::kTimeout || e.code() == ErrorCode::kPeerLost) << e.what();
      EXPECT_NE(std::string(e.what()).find("rank 2"), std::string::npos) << e.what();
    }
  }
}

TEST(SharedMemory, DifferentCountsAreAMismatchOnEveryRank) {
  auto errors = testing::runRanksCollect(3, [](Communicator& c) {
    std::vector<float> v(100 + (c.rank() == 1 ? 1 : 0), 1.0f);
    c.allreduce(tensor(v.data(), v.size()));
  });
  for (int r = 0; r < 3; ++r) {
    ASSERT_TRUE(errors[r]) << "rank " << r;
    try {
      std::rethrow_exception(errors[r]);
    } catch (const Error& e) {
      EXPECT_TRUE(e.code() == ErrorCode::kMismatch || e.code() == ErrorCode::kPeerLost)
          << "rank " << r << ": " << e.what();
      if (r != 2) {
        EXPECT_EQ(e.code(), ErrorCode::kMismatch) << e.what();
      }
    }
  }
}

struct HostCase {
  std::vector<int> hostOf;
  const char* name;
  bool uniform = true;
};

void PrintTo(const HostCase& c, std::ostream* os) {
  *os << c.name;
}

class Hierarchical : public ::testing::TestWithParam<HostCase> {};

TEST_P(Hierarchical, GroupingMatchesTheLayout) {
  const auto& hostOf = GetParam().hostOf;
  const int n = static_cast<int>(hostOf.size());
  auto world = testing::makeWorldWith(n, testing::onHosts(hostOf));
  testing::forEachRank(world, [&](Communicator& c) {
    // Hosts are numbered by their lowest rank.
    std::vector<int> order;
    for (int h : hostOf) {
      if (std::find(order.begin(), order.end(), h) == order.end()) order.push_back(h);
    }
    const int me = c.rank();
    const int host =
        static_cast<int>(std::find(order.begin(), order.end(), hostOf[me]) - order.begin());
    int lr = 0, ls = 0;
    for (int r = 0; r < n; ++r) {
      if (hostOf[r] != hostOf[me]) continue;
      lr += r < me;
      ++ls;
    }
    EXPECT_EQ(c.numHosts(), static_cast<int>(order.size()));
    EXPECT_EQ(c.hostIndex(), host);
    EXPECT_EQ(c.localRank(), lr);
    EXPECT_EQ(c.localSize(), ls);
    auto local = c.localCommunicator();
    auto cross = c.crossHostCommunicator();
    EXPECT_EQ(local->size(), ls);
    EXPECT_EQ(local->rank(), lr);
    EXPECT_EQ(local->numHosts(), 1);
    EXPECT_EQ(cross->numHosts(), cross->size());
    EXPECT_EQ(cross->localSize(), 1);
    // The sub-communicators work: the local sum is the host's rank count.
    int64_t one = 1;
    local->allreduce(tensor(&one, 1));
    EXPECT_EQ(one, ls);
    EXPECT_EQ(local->stats().sharedMemoryOps, ls > 1 ? 1u : 0u);
  });
}

TEST_P(Hierarchical, AllreduceEveryDtypeOpAndTail) {
  const auto& hostOf = GetParam().hostOf;
  const int n = static_cast<int>(hostOf.size());
  auto world = testing::makeWorldWith(n, testing::onHosts(hostOf));
  testing::forEachRank(world, [&](Communicator& c) {
    for (DataType t : testing::allDataTypes()) {
      for (ReduceOp op : testing::allReduceOps()) {
        if (!supportsReduceOp(t, op)) continue;
        // 0, fewer elements than ranks per host, not a multiple of it, several chunks.
        for (size_t count : {size_t(0), size_t(1), size_t(5), size_t(4099)}) {
          checkAllreduce(c, count, t, op, count % 2 == 0);
        }
      }
    }
    checkAllreduce(c, 300001, DataType::kFloat32, ReduceOp::kSum, true);
    Stats s = c.stats();
    EXPECT_GT(s.hierarchicalOps, 0u);
    EXPECT_EQ(s.networkOps, 0u);
  });
}

TEST_P(Hierarchical, BroadcastFromEveryRootAndBarrier) {
  const auto& hostOf = GetParam().hostOf;
  const int n = static_cast<int>(hostOf.size());
  auto world = testing::makeWorldWith(n, testing::onHosts(hostOf));
  testing::forEachRank(world, [&](Communicator& c) {
    for (int root = 0; root < n; ++root) {
      for (size_t count : {size_t(0), size_t(3), size_t(10000)}) {
        std::vector<double> v(count, -1.0);
        if (c.rank() == root) {
          for (size_t i = 0; i < count; ++i) v[i] = root * 0.5 + static_cast<double>(i);
        }
        c.broadcast(tensor(v.data(), count), root);
        for (size_t i = 0; i < count; ++i) ASSERT_EQ(v[i], root * 0.5 + static_cast<double>(i));
      }
      c.barrier();
    }
    EXPECT_EQ(c.stats().networkOps, 0u);
  });
}

TEST_P(Hierarchical, ReduceScatterAndAllgatherAreCorrect) {
  const auto& hostOf = GetParam().hostOf;
  const int n = static_cast<int>(hostOf.size());
  auto world = testing::makeWorldWith(n, testing::onHosts(hostOf));
  testing::forEachRank(world, [&](Communicator& c) {
    const size_t block = 777;
    std::vector<int64_t> in(block * n), out(block), all(block * n);
    for (size_t i = 0; i < in.size(); ++i) in[i] = c.rank() * 3 + static_cast<int64_t>(i);
    c.reduceScatter(tensor(in.data(), in.size()), tensor(out.data(), block));
    for (size_t i = 0; i < block; ++i) {
      const int64_t g = static_cast<int64_t>(c.rank() * block + i);
      ASSERT_EQ(out[i], 3 * n * (n - 1) / 2 + n * g);
    }
    c.allgather(tensor(out.data(), block), tensor(all.data(), all.size()));
    for (int r = 0; r < n; ++r) {
      for (size_t i = 0; i < block; ++i) {
        ASSERT_EQ(all[r * block + i],
                  3 * n * (n - 1) / 2 + n * static_cast<int64_t>(r * block + i));
      }
    }
    // In place: this rank's block of the output is the input.
    std::vector<int64_t> again(block * n, -7);
    std::memcpy(again.data() + c.rank() * block, out.data(), block * sizeof(int64_t));
    c.allgather(tensor(again.data() + c.rank() * block, block), tensor(again.data(), again.size()));
    EXPECT_EQ(again, all);
    // avg over every dtype's exact inputs, block sizes 0 and 1 included.
    for (size_t b : {size_t(0), size_t(1), size_t(33)}) {
      std::vector<double> x(b * n), y(b + 1);
      for (size_t i = 0; i < x.size(); ++i)
        x[i] = exactInput(c.rank(), i, ReduceOp::kAvg, DataType::kFloat64);
      c.reduceScatter(tensor(x.data(), x.size()), tensor(y.data(), b), ReduceOp::kAvg);
      for (size_t i = 0; i < b; ++i) {
        ASSERT_EQ(y[i], exactExpected(n, c.rank() * b + i, ReduceOp::kAvg, DataType::kFloat64));
      }
    }
    const Stats s = c.stats();
    const bool uniform = GetParam().uniform;
    EXPECT_EQ(s.networkOps, uniform ? 0u : 6u) << "reduce-scatter/allgather path";
  });
}

TEST_P(Hierarchical, ForcedRingRunsFlat) {
  const auto& hostOf = GetParam().hostOf;
  const int n = static_cast<int>(hostOf.size());
  Options base;
  base.algorithm = "ring";
  auto world = testing::makeWorldWith(n, testing::onHosts(hostOf, base));
  testing::forEachRank(world, [&](Communicator& c) {
    checkAllreduce(c, 5000, DataType::kFloat32, ReduceOp::kSum, true);
    EXPECT_EQ(c.stats().networkOps, 1u);
    EXPECT_EQ(c.stats().hierarchicalOps, 0u);
  });
}

INSTANTIATE_TEST_SUITE_P(, Hierarchical,
                         ::testing::Values(HostCase{{0, 0, 1, 1}, "TwoByTwo"},
                                           HostCase{{0, 0, 1, 1, 2, 2}, "ThreeByTwo"},
                                           HostCase{{0, 1, 0, 1}, "Interleaved"},
                                           HostCase{{0, 0, 1}, "Unequal", false},
                                           HostCase{{5, 5, 5, 2}, "ThreeAndOne", false}),
                         [](const ::testing::TestParamInfo<HostCase>& i) {
                           return std::string(i.param.name);
                         });

TEST(HostGrouping, OneRankPerHostIsFlat) {
  auto world = testing::makeWorldWith(3, testing::onHosts({0, 1, 2}));
  testing::forEachRank(world, [&](Communicator& c) {
    EXPECT_EQ(c.numHosts(), 3);
    checkAllreduce(c, 1000, DataType::kFloat32, ReduceOp::kSum, true);
    EXPECT_EQ(c.stats().networkOps, 1u);
  });
}

}  // namespace
}  // namespace gflow

namespace gflow {
namespace {

// Phases of a hierarchical op carry the op's fingerprint: ranks that call
// different ops fail with mismatch even where the phases alone would agree.
TEST(HierarchicalMismatch, AvgAgainstSumIsAMismatch) {
  const auto optionsOf = testing::onHosts({0, 0, 1, 1});
  std::vector<std::exception_ptr> errors(4);
  auto world = testing::makeWorldWith(4, optionsOf);
  testing::forEachRank(world, [&](Communicator& c) {
    std::vector<float> v(1000, 1.0f);
    try {
      c.allreduce(tensor(v.data(), v.size()), c.rank() == 0 ? ReduceOp::kAvg : ReduceOp::kSum);
    } catch (...) {
      errors[c.rank()] = std::current_exception();
    }
  });
  for (int r = 0; r < 4; ++r) {
    ASSERT_TRUE(errors[r]) << "rank " << r << " completed a mismatched allreduce";
    try {
      std::rethrow_exception(errors[r]);
    } catch (const Error& e) {
      EXPECT_TRUE(e.code() == ErrorCode::kMismatch || e.code() == ErrorCode::kPeerLost)
          << "rank " << r << ": " << e.what();
    }
  }
  for (int r : {0, 1}) {  // rank 0's host sees the disagreement first-hand
    try {
      std::rethrow_exception(errors[r]);
    } catch (const Error& e) {
      EXPECT_EQ(e.code(), ErrorCode::kMismatch) << "rank " << r << ": " << e.what();
    }
  }
}

// A rank that stops calling collectives (its thread leaves gflow) stalls a
// hierarchical allreduce in both of its phases. Every other rank fails, and
// names the stalled rank: the ranks that wait on it directly time out
// blaming it; a rank that waits on one of those, across hosts or in shared
// memory, finds it alive (it answers probes from its wait in the other
// phase) and reports the failure that rank relays. (A rank stopped in the
// middle of an op, the cross phase on the helper thread, is FaultStop's.)
TEST(HierarchicalStall, EveryRankNamesTheRankThatStopsCalling) {
  for (const int victim : {3, 2}) {
    Options base;
    base.timeout = std::chrono::milliseconds(600);
    auto world = testing::makeWorldWith(4, testing::onHosts({0, 0, 1, 1}, base));
    std::vector<std::string> what(4);
    std::atomic<int> failed{0};
    testing::forEachRank(world, [&](Communicator& c) {
      std::vector<float> v(4096, 1.0f);
      c.allreduce(tensor(v.data(), v.size()));
      if (c.rank() == victim) {  // stalls outside gflow until the others gave up
        const auto until = std::chrono::steady_clock::now() + std::chrono::seconds(20);
        while (failed < 3 && std::chrono::steady_clock::now() < until) {
          std::this_thread::sleep_for(std::chrono::milliseconds(5));
        }
        return;
      }
      try {
        c.allreduce(tensor(v.data(), v.size()));
        what[c.rank()] = "completed without the stalled rank";
      } catch (const Error& e) {
        what[c.rank()] = std::string(toString(e.code())) + ": " + e.what();
      }
      ++failed;
    });
    const std::regex names("\\b(rank|peer) " + std::to_string(victim) + "\\b");
    for (int r = 0; r < 4; ++r) {
      if (r == victim) continue;
      EXPECT_TRUE(what[r].rfind("timeout: ", 0) == 0 || what[r].rfind("peer_lost: ", 0) == 0)
          << "victim " << victim << " rank " << r << ": " << what[r];
      EXPECT_TRUE(std::regex_search(what[r], names))
          << "victim " << victim << " rank " << r << " blames another rank: " << what[r];
    }
  }
}

// Settings that decide an op's path must agree, or ranks would wait in
// different places until the timeout: creation fails on every rank instead.
TEST(HostGrouping, DifferentAlgorithmSettingsFailCreationOnEveryRank) {
  auto store = createHashStore();
  std::vector<std::thread> threads;
  std::vector<std::string> what(3);
  for (int r = 0; r < 3; ++r) {
    threads.emplace_back([&, r] {
      Options o;
      o.rank = r;
      o.size = 3;
      o.store = store;
      o.algorithm = r == 1 ? "ring" : "";
      try {
        Communicator::create(o);
      } catch (const Error& e) {
        what[r] = std::string(toString(e.code())) + ": " + e.what();
      }
    });
  }
  for (auto& t : threads) t.join();
  for (int r = 0; r < 3; ++r) {
    EXPECT_NE(what[r].find("invalid_argument"), std::string::npos)
        << "rank " << r << ": " << what[r];
    EXPECT_NE(what[r].find("configured differently"), std::string::npos) << what[r];
  }
}

}  // namespace
}  // namespace gflow
