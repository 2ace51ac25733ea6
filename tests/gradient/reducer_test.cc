// GradientReducer (lazy allreduce with chunk fusion) and allreduceCoalesced,
// ranks as threads: results against an exact reference whatever the order
// in which ranks produce gradients, in fixed-bucket and cycle-time modes;
// the errors a training loop can make; the timeline file.
#include <gtest/gtest.h>

#include <algorithm>
#include <atomic>
#include <cmath>
#include <cstdio>
#include <fstream>
#include <future>
#include <random>
#include <sstream>
#include <thread>

#include "gflow/gflow.h"
#include "gflow/reducer.h"
#include "testing/ranks.h"
#include "testing/values.h"

namespace gflow {
namespace {

using std::chrono::milliseconds;
using testing::exactExpected;
using testing::exactInput;

// The reducer shares ownership of its communicator; runRanks owns these.
std::shared_ptr<Communicator> borrow(Communicator& c) {
  return std::shared_ptr<Communicator>(&c, [](Communicator*) {});
}

// Every rank's error from fn (message), with a short timeout so a hang fails.
std::vector<std::string> errorsOf(int n, const std::function<void(Communicator&)>& fn) {
  Options o;
  o.timeout = std::chrono::seconds(20);
  auto errs = testing::runRanksCollect(n, fn, o);
  std::vector<std::string> out(n);
  for (int r = 0; r < n; ++r) {
    if (!errs[r]) continue;
    try {
      std::rethrow_exception(errs[r]);
    } catch (const Error& e) {
      out[r] = std::string(toString(e.code())) + ": " + e.what();
    }
  }
  return out;
}

// A model's gradients: mixed sizes (some empty, some above the threshold
// so they go in place) and dtypes.
struct Model {
  std::vector<std::vector<uint8_t>> storage;
  std::vector<Tensor> grads;
  std::vector<std::string> names;
  explicit Model(const std::vector<std::pair<size_t, DataType>>& shapes) {
    for (auto& [count, dtype] : shapes) {
      storage.emplace_back(count * dataTypeSize(dtype) + 1);
      grads.emplace_back(storage.back().data(), count, dtype);
      names.push_back("layer" + std::to_string(names.size()));
    }
  }
  // Element j of tensor i gets the exact-input value of global index base+j.
  void fill(int rank, int step, ReduceOp op) {
    for (size_t i = 0; i < grads.size(); ++i) {
      for (size_t j = 0; j < grads[i].count; ++j) {
        testing::setValue(grads[i].data, j, grads[i].dtype,
                          exactInput(rank, index(i, j, step), op, grads[i].dtype));
      }
    }
  }
  // Number of wrong elements against the exact reference of n ranks.
  size_t wrong(int n, int step, ReduceOp op) const {
    size_t bad = 0;
    for (size_t i = 0; i < grads.size(); ++i) {
      for (size_t j = 0; j < grads[i].count; ++j) {
        const double want = testing::roundTo(
            grads[i].dtype, exactExpected(n, index(i, j, step), op, grads[i].dtype));
        const double got = testing::getValue(grads[i].data, j, grads[i].dtype);
        if (std::fabs(got - want) > 1e-6 * std::max(1.0, std::fabs(want))) ++bad;
      }
    }
    return bad;
  }
  static size_t index(size_t i, size_t j, int step) { return i * 1000 + j + 17 * step; }
};

std::vector<std::pair<size_t, DataType>> mixedShapes() {
  return {{300, DataType::kFloat32},  {1, DataType::kFloat32},   {0, DataType::kFloat32},
          {5000, DataType::kFloat32}, {77, DataType::kFloat64},  {64, DataType::kInt32},
          {129, DataType::kFloat32},  {2, DataType::kFloat64},   {900, DataType::kFloat32},
          {33, DataType::kInt32},     {1200, DataType::kFloat32}};
}

// Each rank produces the gradients in its own order (a different shuffle per
// rank and step), as with data-dependent backward passes.
std::vector<size_t> orderFor(int rank, int step, size_t n) {
  std::vector<size_t> order(n);
  for (size_t i = 0; i < n; ++i) order[i] = i;
  std::mt19937 rng(static_cast<uint32_t>(rank * 1000 + step));
  if (rank > 0) std::shuffle(order.begin(), order.end(), rng);
  return order;
}

void runSteps(Communicator& c, ReducerOptions o, int steps) {
  Model m(mixedShapes());
  o.names = m.names;
  GradientReducer reducer(borrow(c), m.grads, o);
  for (int s = 0; s < steps; ++s) {
    m.fill(c.rank(), s, o.op);
    for (size_t i : orderFor(c.rank(), s, m.grads.size())) reducer.ready(i);
    reducer.wait();
    ASSERT_EQ(m.wrong(c.size(), s, o.op), 0u)
        << "rank " << c.rank() << " step " << s << " threshold " << o.fusionThreshold;
  }
  EXPECT_EQ(reducer.stats().steps, static_cast<uint64_t>(steps));
}

TEST(Reducer, FixedBucketsExactForAnyOrderOfReadiness) {
  for (uint64_t threshold : {uint64_t(64), uint64_t(2048), uint64_t(1) << 30}) {
    for (ReduceOp op : {ReduceOp::kSum, ReduceOp::kAvg}) {
      ReducerOptions o;
      o.op = op;
      o.fusionThreshold = threshold;
      o.cycleTime = milliseconds(0);
      testing::runRanks(3, [&](Communicator& c) { runSteps(c, o, 3); });
    }
  }
}

TEST(Reducer, CycleTimeRoundsExactForAnyOrderOfReadiness) {
  for (uint64_t threshold : {uint64_t(64), uint64_t(4096), uint64_t(1) << 30}) {
    ReducerOptions o;
    o.fusionThreshold = threshold;
    o.cycleTime = milliseconds(1);
    testing::runRanks(4, [&](Communicator& c) { runSteps(c, o, 3); });
  }
}

TEST(Reducer, CycleTimeRoundWithNothingReadyEverywhereSendsNothing) {
  // Rank 0 readies the first half, rank 1 the second half; both wait until
  // their first round has taken its snapshot (nothing is ready on both), then
  // ready the rest. Every tensor must be reduced exactly once.
  std::atomic<int> snapshotted{0};
  testing::runRanks(2, [&](Communicator& c) {
    std::vector<std::vector<float>> g(12, std::vector<float>(1000));
    std::vector<Tensor> t;
    for (auto& v : g) t.push_back(tensor(v.data(), v.size()));
    ReducerOptions o;
    o.op = ReduceOp::kSum;
    o.fusionThreshold = 64;
    o.cycleTime = milliseconds(1);
    GradientReducer r(borrow(c), t, o);
    for (size_t i = 0; i < g.size(); ++i) std::fill(g[i].begin(), g[i].end(), float(i + c.rank()));
    const size_t half = g.size() / 2;
    auto mine = [&](size_t k) { return c.rank() == 0 ? k : g.size() - 1 - k; };
    for (size_t k = 0; k < half; ++k) r.ready(mine(k));
    const auto giveUp = std::chrono::steady_clock::now() + std::chrono::seconds(60);
    while (r.stats().controlOps == 0 && std::chrono::steady_clock::now() < giveUp) {
      std::this_thread::sleep_for(milliseconds(1));
    }
    ++snapshotted;
    while (snapshotted.load() < 2 && std::chrono::steady_clock::now() < giveUp) {
      std::this_thread::sleep_for(milliseconds(1));
    }
    for (size_t k = half; k < g.size(); ++k) r.ready(mine(k));
    r.wait();
    EXPECT_GE(r.stats().controlOps, 2u);
    for (size_t i = 0; i < g.size(); ++i) ASSERT_EQ(g[i][999], float(2 * i + 1)) << i;
  });
}

TEST(Reducer, BucketsFollowTheThresholdAndCountFusedOps) {
  testing::runRanks(2, [](Communicator& c) {
    // Ten 1 KiB gradients with gaps between them (not adjacent: packed).
    std::vector<float> storage(10 * 300, 1.0f);
    std::vector<Tensor> t;
    for (int i = 0; i < 10; ++i) t.push_back(tensor(storage.data() + 300 * i, 256));
    ReducerOptions o;
    o.op = ReduceOp::kSum;
    o.fusionThreshold = 3000;  // three tensors per bucket
    o.cycleTime = milliseconds(0);
    GradientReducer r(borrow(c), t, o);
    ASSERT_EQ(r.buckets().size(), 4u);
    EXPECT_EQ(r.buckets()[3], (std::vector<size_t>{9}));
    const uint64_t before = r.communicator().stats().allreduce;
    for (size_t i = 0; i < t.size(); ++i) r.ready(i);
    r.wait();
    EXPECT_EQ(r.communicator().stats().allreduce - before, 4u);
    EXPECT_EQ(r.stats().fusedOps, 4u);
    // The last bucket holds one tensor: trivially contiguous, in place.
    EXPECT_EQ(r.stats().packedBytes, 9u * 1024);
    EXPECT_EQ(r.stats().inPlaceBytes, 1024u);
    EXPECT_EQ(storage[9 * 300 + 255], 2.0f);
    EXPECT_EQ(storage[9 * 300 + 256], 1.0f);  // the gap is untouched
  });
}

TEST(Reducer, ViewsIntoOneFlatBufferAreReducedInPlace) {
  for (int cycleMs : {0, 1}) {
    testing::runRanks(3, [&](Communicator& c) {
      // Ten gradients of 100 floats, back to back in one buffer, plus one
      // separate tensor in the middle of the list: the buckets around it
      // are in place, the one that holds it is packed.
      std::vector<float> flat(1000), apart(100);
      std::vector<Tensor> t;
      for (int i = 0; i < 10; ++i) t.push_back(tensor(flat.data() + 100 * i, 100));
      t.insert(t.begin() + 5, tensor(apart.data(), apart.size()));
      ReducerOptions o;
      o.op = ReduceOp::kSum;
      o.fusionThreshold = 800;  // two tensors per bucket
      o.cycleTime = milliseconds(cycleMs);
      GradientReducer r(borrow(c), t, o);
      for (int s = 0; s < 2; ++s) {
        for (size_t i = 0; i < flat.size(); ++i) flat[i] = float(i % 97 + c.rank() + s);
        for (size_t i = 0; i < apart.size(); ++i) apart[i] = float(i + c.rank());
        for (size_t i = 0; i < t.size(); ++i) r.ready(t.size() - 1 - i);
        r.wait();
        for (size_t i = 0; i < flat.size(); ++i) ASSERT_EQ(flat[i], float(3 * (i % 97 + s) + 3));
        for (size_t i = 0; i < apart.size(); ++i) ASSERT_EQ(apart[i], float(3 * i + 3));
      }
      if (cycleMs == 0) {
        // Buckets {0,1} {2,3} {4,5} {6,7} {8,9} {10}; {4,5} holds `apart`.
        EXPECT_EQ(r.stats().packedBytes, 2u * 800);
        EXPECT_EQ(r.stats().inPlaceBytes, 2u * (4000 - 400));
      }
    });
  }
}

TEST(Reducer, OverlappingTensorsAreRejected) {
  auto errs = testing::runRanksCollect(2, [](Communicator& c) {
    std::vector<float> v(100);
    GradientReducer r(borrow(c), {tensor(v.data(), 60), tensor(v.data() + 50, 50)});
  });
  for (auto& e : errs) {
    ASSERT_TRUE(e);
    try {
      std::rethrow_exception(e);
    } catch (const Error& err) {
      EXPECT_EQ(err.code(), ErrorCode::kInvalidArgument);
      EXPECT_NE(std::string(err.what()).find("overlap in memory"), std::string::npos) << err.what();
    }
  }
}

TEST(Reducer, OtherOpsOnTheCommunicatorNeverInterleaveWithAStep) {
  // Each rank calls an allreduce of its own at a different point of the step
  // (before, between and after its ready() calls): the reducer's ops run on
  // its own communicator, so nothing pairs up wrongly.
  for (int cycleMs : {0, 1}) {
    testing::runRanks(3, [&](Communicator& c) {
      std::vector<std::vector<float>> g(6, std::vector<float>(500));
      std::vector<Tensor> t;
      for (auto& v : g) t.push_back(tensor(v.data(), v.size()));
      ReducerOptions o;
      o.op = ReduceOp::kSum;
      o.fusionThreshold = 4000;
      o.cycleTime = milliseconds(cycleMs);
      GradientReducer r(borrow(c), t, o);
      for (int s = 0; s < 3; ++s) {
        for (auto& v : g) std::fill(v.begin(), v.end(), float(c.rank() + s));
        double loss = c.rank();
        const size_t at = static_cast<size_t>(c.rank() * 3);  // 0, 3 or 6
        for (size_t i = 0; i <= g.size(); ++i) {
          if (i == at) c.allreduce(Tensor(&loss, 1, DataType::kFloat64));
          if (i < g.size()) r.ready(c.rank() == 1 ? g.size() - 1 - i : i);
        }
        r.wait();
        EXPECT_EQ(loss, 3.0);
        for (auto& v : g) ASSERT_EQ(v[499], float(3 + 3 * s));
      }
    });
  }
}

TEST(Reducer, DestroyedMidStepAbortsThePeersNotTheCallersCommunicator) {
  for (int cycleMs : {0, 2}) {
    std::atomic<bool> destroyed{false};
    auto errs = errorsOf(2, [&](Communicator& c) {
      std::vector<std::vector<float>> g(4, std::vector<float>(100, 1.0f));
      std::vector<Tensor> t;
      for (auto& v : g) t.push_back(tensor(v.data(), v.size()));
      ReducerOptions o;
      o.fusionThreshold = 400;  // one tensor per bucket
      o.cycleTime = milliseconds(cycleMs);
      {
        GradientReducer r(borrow(c), t, o);
        r.ready(0);
        if (c.rank() == 1) {
          destroyed = true;
        } else {
          while (!destroyed) std::this_thread::sleep_for(milliseconds(1));
          std::this_thread::sleep_for(milliseconds(20));
          // Firing on the aborted communicator: ready() still raises
          // nothing, wait() raises the root cause.
          for (size_t i = 1; i < t.size(); ++i) r.ready(i);
          try {
            r.wait();
            ADD_FAILURE() << "wait() succeeded";
          } catch (const Error& e) {
            // aborted or peer_lost, depending on the path that noticed.
            EXPECT_TRUE(e.code() == ErrorCode::kAborted || e.code() == ErrorCode::kPeerLost)
                << e.what();
            EXPECT_NE(std::string(e.what()).find("on rank 1 was destroyed in the middle of step 0"),
                      std::string::npos)
                << e.what();
          }
        }
      }
      // The caller's communicator is untouched.
      int32_t x = 1;
      c.allreduce(tensor(&x, 1));
      EXPECT_EQ(x, 2);
    });
    for (auto& e : errs) EXPECT_EQ(e, "") << "cycle " << cycleMs;
  }
}

TEST(Reducer, ReadyNeverWaitsForAPeer) {
  // Rank 1 starts its step only after rank 0's ready() calls have all
  // returned: if ready() blocked on communication this would deadlock (and
  // fail on the 60 s guard).
  std::promise<void> rank0Done;
  std::shared_future<void> done = rank0Done.get_future().share();
  testing::runRanks(2, [&](Communicator& c) {
    std::vector<std::vector<float>> g(8, std::vector<float>(1000, 1.0f));
    std::vector<Tensor> t;
    for (auto& v : g) t.push_back(tensor(v.data(), v.size()));
    ReducerOptions o;
    o.fusionThreshold = 4096;
    GradientReducer r(borrow(c), t, o);
    if (c.rank() == 1) {
      ASSERT_EQ(done.wait_for(std::chrono::seconds(60)), std::future_status::ready);
    }
    for (size_t i = 0; i < t.size(); ++i) r.ready(i);
    if (c.rank() == 0) rank0Done.set_value();
    r.wait();
    EXPECT_EQ(g[7][999], 1.0f);
  });
}

// Gradients of the newer dtypes ride in their own buckets; an op that does
// not apply to one of them (avg of bool) fails creation naming the tensor.
TEST(Reducer, Int16AndBoolTensorsReduceAndAvgOfBoolIsRefused) {
  testing::runRanks(3, [](Communicator& c) {
    std::vector<int16_t> counts(100, static_cast<int16_t>(1000 * (c.rank() + 1)));
    bool mask[7] = {c.rank() == 0, false, true, false, false, false, c.rank() == 2};
    ReducerOptions o;
    o.op = ReduceOp::kMax;
    GradientReducer r(
        borrow(c), {Tensor(counts.data(), 100, DataType::kInt16), Tensor(mask, 7, DataType::kBool)},
        o);
    r.ready(1);
    r.ready(0);
    r.wait();
    EXPECT_EQ(counts[99], 3000);
    EXPECT_TRUE(mask[0] && !mask[1] && mask[2] && mask[6]);
  });
  auto errs = errorsOf(2, [](Communicator& c) {
    float w[4] = {};
    bool mask[3] = {};
    ReducerOptions o;
    o.op = ReduceOp::kAvg;
    o.names = {"fc.weight", "fc.mask"};
    GradientReducer r(borrow(c), {tensor(w, 4), Tensor(mask, 3, DataType::kBool)}, o);
  });
  for (const std::string& e : errs) {
    EXPECT_EQ(e.rfind("invalid_argument: ", 0), 0u) << e;
    EXPECT_NE(e.find("'fc.mask'"), std::string::npos) << e;
    EXPECT_NE(e.find("avg does not apply"), std::string::npos) << e;
  }
}

TEST(Reducer, ReadyTwiceAndOutOfRangeAreRejectedWithoutHarm) {
  testing::runRanks(2, [](Communicator& c) {
    std::vector<float> a(10, 1.0f), b(10, 2.0f);
    ReducerOptions o;
    o.op = ReduceOp::kSum;
    o.names = {"fc.weight", "fc.bias"};
    GradientReducer r(borrow(c), {tensor(a.data(), 10), tensor(b.data(), 10)}, o);
    r.ready(1);
    try {
      r.ready(1);
      ADD_FAILURE() << "ready twice accepted";
    } catch (const Error& e) {
      EXPECT_EQ(e.code(), ErrorCode::kInvalidArgument);
      EXPECT_NE(std::string(e.what()).find("'fc.bias'"), std::string::npos) << e.what();
      EXPECT_NE(std::string(e.what()).find("twice"), std::string::npos) << e.what();
      EXPECT_EQ(e.rank(), c.rank());
    }
    EXPECT_THROW(r.ready(2), Error);
    r.ready(0);
    r.wait();
    EXPECT_EQ(a[0], 2.0f);
    EXPECT_EQ(b[9], 4.0f);
  });
}

TEST(Reducer, MissingReadyAtWaitFailsEveryRankNamingTheTensor) {
  for (int cycleMs : {0, 2}) {
    auto errs = errorsOf(3, [&](Communicator& c) {
      std::vector<std::vector<float>> g(6, std::vector<float>(100, 1.0f));
      std::vector<Tensor> t;
      for (auto& v : g) t.push_back(tensor(v.data(), v.size()));
      ReducerOptions o;
      o.fusionThreshold = 800;  // two tensors per bucket
      o.cycleTime = milliseconds(cycleMs);
      o.names = {"l0", "l1", "l2", "l3", "l4", "l5"};
      GradientReducer r(borrow(c), t, o);
      for (size_t i = 0; i < t.size(); ++i) {
        if (!(c.rank() == 2 && i == 3)) r.ready(i);
      }
      r.wait();
    });
    for (int r = 0; r < 3; ++r) {
      SCOPED_TRACE("cycle " + std::to_string(cycleMs) + " rank " + std::to_string(r));
      EXPECT_NE(errs[r].find("invalid_argument"), std::string::npos) << errs[r];
      EXPECT_NE(errs[r].find("'l3'"), std::string::npos) << errs[r];
      EXPECT_NE(errs[r].find("rank 2"), std::string::npos) << errs[r];
    }
  }
}

TEST(Reducer, CycleModeNamesTheLowestMissingRankWithItsOwnTensor) {
  auto errs = errorsOf(3, [](Communicator& c) {
    std::vector<std::vector<float>> g(6, std::vector<float>(10));
    std::vector<Tensor> t;
    for (auto& v : g) t.push_back(tensor(v.data(), v.size()));
    ReducerOptions o;
    o.cycleTime = milliseconds(1);
    o.names = {"l0", "l1", "l2", "l3", "l4", "l5"};
    GradientReducer r(borrow(c), t, o);
    // Rank 1 misses l4, rank 2 misses l2; rank 0 has everything.
    const size_t skip = c.rank() == 1 ? 4 : c.rank() == 2 ? 2 : 99;
    for (size_t i = 0; i < t.size(); ++i) {
      if (i != skip) r.ready(i);
    }
    r.wait();
  });
  for (auto& e : errs) {
    EXPECT_NE(e.find("rank 1 called wait() in step 0 while tensor 4 ('l4'"), std::string::npos)
        << e;
  }
}

TEST(Reducer, CycleModeKeepsTheCommunicatorUsableAfterAMissingReady) {
  testing::runRanks(2, [](Communicator& c) {
    std::vector<float> a(10, 1.0f), b(10, 1.0f);
    ReducerOptions o;
    o.op = ReduceOp::kSum;
    o.cycleTime = milliseconds(1);
    GradientReducer r(borrow(c), {tensor(a.data(), 10), tensor(b.data(), 10)}, o);
    r.ready(0);
    if (c.rank() == 0) r.ready(1);
    EXPECT_THROW(r.wait(), Error);
    std::fill(a.begin(), a.end(), 1.0f);
    std::fill(b.begin(), b.end(), 1.0f);
    r.ready(1);
    r.ready(0);
    r.wait();
    EXPECT_EQ(a[3], 2.0f);
    EXPECT_EQ(b[3], 2.0f);
  });
}

TEST(Reducer, AMissingReadyLeavesTheCallersCommunicatorUsable) {
  testing::runRanks(2, [](Communicator& c) {
    std::vector<float> a(10, 1.0f), b(10, 1.0f);
    GradientReducer r(borrow(c), {tensor(a.data(), 10), tensor(b.data(), 10)});
    r.ready(0);
    if (c.rank() == 0) r.ready(1);
    EXPECT_THROW(r.wait(), Error);
    int32_t x = 1;
    c.allreduce(tensor(&x, 1));
    EXPECT_EQ(x, 2);
  });
}

TEST(Reducer, DifferentRegistrationsRaiseMismatchNamingTheTensor) {
  auto errs = errorsOf(3, [](Communicator& c) {
    std::vector<float> a(10), b(c.rank() == 1 ? 11 : 12), d(5);
    ReducerOptions o;
    o.names = {"emb", "proj", "out"};
    GradientReducer r(
        borrow(c),
        {tensor(a.data(), a.size()), tensor(b.data(), b.size()), tensor(d.data(), d.size())}, o);
  });
  for (int r = 0; r < 3; ++r) {
    EXPECT_NE(errs[r].find("mismatch"), std::string::npos) << errs[r];
    EXPECT_NE(errs[r].find("at tensor 1"), std::string::npos) << errs[r];
    EXPECT_NE(errs[r].find("rank 1 registered 11 x float32"), std::string::npos) << errs[r];
    EXPECT_NE(errs[r].find("'proj'"), std::string::npos) << errs[r];
  }
  auto opt = errorsOf(2, [](Communicator& c) {
    std::vector<float> a(10);
    ReducerOptions o;
    o.fusionThreshold = c.rank() == 0 ? 1024 : 2048;
    GradientReducer r(borrow(c), {tensor(a.data(), a.size())}, o);
  });
  for (auto& e : opt) EXPECT_NE(e.find("fusion threshold 2048"), std::string::npos) << e;
  auto fewer = errorsOf(2, [](Communicator& c) {
    std::vector<float> a(10), b(10);
    std::vector<Tensor> t{tensor(a.data(), 10)};
    if (c.rank() == 0) t.push_back(tensor(b.data(), 10));
    GradientReducer r(borrow(c), t);
  });
  for (auto& e : fewer) EXPECT_NE(e.find("rank 1 registered no tensor"), std::string::npos) << e;
}

TEST(Reducer, InvalidTensorFailsEveryRank) {
  auto errs = errorsOf(2, [](Communicator& c) {
    std::vector<float> a(10);
    std::vector<Tensor> t{tensor(a.data(), 10)};
    if (c.rank() == 1) t[0].data = nullptr;
    GradientReducer r(borrow(c), t);
  });
  for (auto& e : errs)
    EXPECT_NE(e.find("tensor 0 (10 x float32) has null data"), std::string::npos) << e;
}

TEST(Coalesced, ReducesAListInPlace) {
  testing::runRanks(3, [](Communicator& c) {
    Model m(mixedShapes());
    for (uint64_t threshold : {uint64_t(100), uint64_t(1) << 20}) {
      m.fill(c.rank(), 0, ReduceOp::kSum);
      allreduceCoalesced(c, m.grads, ReduceOp::kSum, threshold).wait();
      ASSERT_EQ(m.wrong(c.size(), 0, ReduceOp::kSum), 0u) << threshold;
    }
    // Several batches in flight, then one blocking op behind them.
    std::vector<std::vector<double>> v(5, std::vector<double>(50, 1.0));
    std::vector<Work> works;
    for (auto& x : v)
      works.push_back(allreduceCoalesced(c, {tensor(x.data(), 25), tensor(x.data() + 25, 25)}));
    double one = 1;
    c.allreduce(tensor(&one, 1));
    for (auto& w : works) {
      EXPECT_TRUE(w.test());
      w.wait();
    }
    EXPECT_EQ(v[4][49], 3.0);
    EXPECT_EQ(one, 3.0);
    EXPECT_FALSE(allreduceCoalesced(c, {}).valid());
  });
}

TEST(Timeline, WritesAChromeTraceOfEveryPhase) {
  const std::string dir = ::testing::TempDir();
  const std::string spec = dir + "gflow_timeline_%r.json";
  testing::runRanks(2, [&](Communicator& c) {
    std::vector<std::vector<float>> g(4, std::vector<float>(300, 1.0f));
    std::vector<Tensor> t;
    for (auto& v : g) t.push_back(tensor(v.data(), v.size()));
    ReducerOptions o;
    o.fusionThreshold = 2000;
    o.timeline = spec;
    o.names = {"conv1.w", "bn1.b", "fc.w", "fc \"b\""};
    GradientReducer r(borrow(c), t, o);
    for (int s = 0; s < 2; ++s) {
      for (size_t i = 0; i < t.size(); ++i) r.ready(i);
      r.wait();
    }
  });
  for (int rank = 0; rank < 2; ++rank) {
    std::ifstream in(dir + "gflow_timeline_" + std::to_string(rank) + ".json");
    ASSERT_TRUE(in.good()) << "rank " << rank;
    std::stringstream ss;
    ss << in.rdbuf();
    const std::string text = ss.str();
    EXPECT_EQ(text.rfind("[", 0), 0u);
    EXPECT_NE(text.find("]\n", text.size() - 3), std::string::npos) << "not closed";
    for (const char* want :
         {"\"ready: conv1.w\"", "\"ready: fc \\\"b\\\"\"", "\"pack: bucket of",
          "\"allreduce: bucket of", "\"unpack: bucket of", "\"queued: ", "\"name\": \"wait\"",
          "\"pid\": ", "\"last_rank\": ", "\"skew_us\": "}) {
      EXPECT_NE(text.find(want), std::string::npos) << want;
    }
    EXPECT_EQ(std::count(text.begin(), text.end(), '{'), std::count(text.begin(), text.end(), '}'));
    std::remove((dir + "gflow_timeline_" + std::to_string(rank) + ".json").c_str());
  }
}

}  // namespace
}  // namespace gflow
