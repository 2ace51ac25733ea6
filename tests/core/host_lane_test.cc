// The host lane (core/host_lane.h) and the executor's use of it: host
// steps of one op run beside another op, never out of order on the same
// memory; and async compressed allreduces on the same buffers still give
// the exact results in order.
#include <gtest/gtest.h>

#include <dirent.h>
#include <atomic>
#include <chrono>
#include <condition_variable>
#include <cstring>
#include <fstream>
#include <mutex>
#include <random>
#include <stdexcept>
#include <thread>

#include "common/check.h"
#include "core/executor.h"
#include "core/host_lane.h"
#include "gflow/gflow.h"
#include "testing/ranks.h"

namespace gflow {
namespace {

using namespace std::chrono_literals;

// A one-shot flag to wait on, with a bound so that a wrong order fails
// the test instead of hanging it.
class Latch {
 public:
  void open() {
    {
      std::lock_guard<std::mutex> lock(m_);
      open_ = true;
    }
    cv_.notify_all();
  }
  bool wait(std::chrono::milliseconds bound = 20s) {
    std::unique_lock<std::mutex> lock(m_);
    return cv_.wait_for(lock, bound, [&] { return open_; });
  }
  bool isOpen() {
    std::lock_guard<std::mutex> lock(m_);
    return open_;
  }

 private:
  std::mutex m_;
  std::condition_variable cv_;
  bool open_ = false;
};

std::shared_ptr<const Overlap> touching(const void* at, size_t bytes,
                                        std::function<void()> ahead = nullptr) {
  auto o = std::make_shared<Overlap>();
  o->touches = {{at, bytes}};
  if (ahead) o->ahead = std::make_shared<OnceStep>(std::move(ahead));
  return o;
}

TEST(HostLane, OverlapsIsHalfOpen) {
  char b[64];
  EXPECT_TRUE(overlaps({{b, 16}}, {{b + 15, 1}}));
  EXPECT_FALSE(overlaps({{b, 16}}, {{b + 16, 8}}));
  EXPECT_FALSE(overlaps({{b + 16, 8}}, {{b, 16}}));
  EXPECT_TRUE(overlaps({{b, 1}, {b + 40, 8}}, {{b + 20, 30}}));
  EXPECT_FALSE(overlaps({{b, 0}}, {{b, 16}}));  // an empty range touches nothing
  EXPECT_FALSE(overlaps({{nullptr, 0}}, {{b, 16}}));
}

TEST(HostLane, OnceStepRunsOnceAndHandsItsErrorToRun) {
  int runs = 0;
  OnceStep ok([&] { ++runs; });
  ok.runQuietly();
  ok.run();
  ok.settle();
  EXPECT_EQ(runs, 1);

  OnceStep bad([&] {
    ++runs;
    throw std::runtime_error("narrowing failed");
  });
  bad.runQuietly();  // the lane: swallows it
  EXPECT_THROW(bad.run(), std::runtime_error);
  EXPECT_EQ(runs, 2);

  OnceStep never([&] { ++runs; });
  never.settle();  // the op ended first: the step must not run later
  never.runQuietly();
  EXPECT_EQ(runs, 2);
}

TEST(HostLane, WaitForWaitsOnlyForJobsOnTheSameMemory) {
  char a[16], b[16];
  Latch release, ran;
  std::atomic<bool> secondRan{false};
  HostLane lane;
  lane.post({{a, sizeof a}}, [&] {
    ran.open();
    release.wait();
  });
  lane.post({{b, sizeof b}}, [&] { secondRan = true; });
  ASSERT_TRUE(ran.wait());
  lane.waitFor({{a + sizeof a, 0}});  // nothing there: returns at once
  std::thread releaser([&] {
    std::this_thread::sleep_for(50ms);
    release.open();
  });
  lane.waitFor({{b, 1}});  // the second job, which runs after the first
  EXPECT_TRUE(secondRan);
  lane.drain();
  releaser.join();
}

TEST(ExecutorLane, NextOpsAheadStepRunsWhileTheOpBeforeExecutes) {
  char a[64], b[64];
  Executor ex;
  Latch started, release, aheadRan;
  auto first = ex.submit(
      [&] {
        started.open();
        release.wait();
      },
      false, touching(a, sizeof a));
  ASSERT_TRUE(started.wait());
  auto ahead = touching(b, sizeof b, [&] { aheadRan.open(); });
  auto second = ex.submit([step = ahead->ahead] { step->run(); }, false, ahead);
  EXPECT_TRUE(aheadRan.wait());  // while the first op still runs
  release.open();
  first->wait(0ms);
  second->wait(0ms);
}

TEST(ExecutorLane, AheadStepOnTheRunningOpsMemoryWaitsForIt) {
  char a[64];
  Executor ex;
  Latch started, release;
  std::atomic<bool> firstEnded{false}, aheadSawEnd{false};
  auto first = ex.submit(
      [&] {
        started.open();
        release.wait();
        firstEnded = true;
      },
      false, touching(a, sizeof a));
  ASSERT_TRUE(started.wait());
  auto ahead = touching(a + 32, 8, [&] { aheadSawEnd = firstEnded.load(); });
  auto second = ex.submit([step = ahead->ahead] { step->run(); }, false, ahead);
  std::this_thread::sleep_for(50ms);  // time for a wrong early run to show
  release.open();
  first->wait(0ms);
  second->wait(0ms);
  EXPECT_TRUE(aheadSawEnd);
}

TEST(ExecutorLane, AnOpsEndOnTheLaneLetsTheNextOpRun) {
  char a[64], b[64];
  Executor ex;
  Latch release, nextRan;
  auto first =
      ex.submit([&] { ex.finishOnLane([&] { release.wait(); }); }, false, touching(a, sizeof a));
  auto second = ex.submit([&] { nextRan.open(); }, false, touching(b, sizeof b));
  EXPECT_TRUE(nextRan.wait());  // while the first op's end is still on the lane
  EXPECT_FALSE(first->done());
  release.open();
  first->wait(0ms);
  second->wait(0ms);
}

// The next op on the same memory, or one that names none, waits for the
// end on the lane.
TEST(ExecutorLane, OpsOnTheSameMemoryOrNamingNoneWaitForTheLane) {
  char a[64];
  for (bool names : {true, false}) {
    Executor ex;
    std::atomic<bool> ended{false}, sawEnd{false};
    auto first = ex.submit(
        [&] {
          ex.finishOnLane([&] {
            std::this_thread::sleep_for(50ms);  // time for a wrong early start to show
            ended = true;
          });
        },
        false, touching(a, sizeof a));
    auto second =
        ex.submit([&] { sawEnd = ended.load(); }, false, names ? touching(a + 8, 8) : nullptr);
    second->wait(0ms);
    EXPECT_TRUE(sawEnd) << (names ? "same memory" : "no footprint");
    first->wait(0ms);
  }
}

TEST(ExecutorLane, AnErrorAtTheEndFailsTheOp) {
  char a[64];
  Executor ex;
  auto w = ex.submit([&] { ex.finishOnLane([] { throw std::runtime_error("widen failed"); }); },
                     false, touching(a, sizeof a));
  try {
    w->wait(0ms);
    FAIL() << "no error";
  } catch (const Error& e) {
    EXPECT_EQ(e.code(), ErrorCode::kInternal);
    EXPECT_NE(std::string(e.what()).find("widen failed"), std::string::npos);
  }
}

TEST(ExecutorLane, ATaskFailingAfterItsEndWasSetFailsTheOpAndSkipsTheEnd) {
  char a[64];
  std::atomic<bool> endRan{false};
  {
    Executor ex;
    auto w = ex.submit(
        [&] {
          ex.finishOnLane([&] { endRan = true; });
          GFLOW_THROW(kPeerLost, ErrorContext{"allreduce"}) << "peer 1 lost";
        },
        false, touching(a, sizeof a));
    EXPECT_THROW(w->wait(0ms), Error);
  }  // the executor's lane has run what it had
  EXPECT_FALSE(endRan);
}

int threadsNamed(const std::string& name) {
  int n = 0;
  DIR* d = opendir("/proc/self/task");
  if (!d) return -1;
  while (dirent* e = readdir(d)) {
    std::ifstream comm(std::string("/proc/self/task/") + e->d_name + "/comm");
    std::string got;
    if (std::getline(comm, got) && got == name) ++n;
  }
  closedir(d);
  return n;
}

// Async compressed allreduces queued on the same and on overlapping
// buffers, with uncompressed ones between: each sees the one before it,
// as if run one at a time. Small integers are exact in float16.
TEST(HostLaneAllreduce, AsyncCompressedOpsOnSharedBuffersKeepTheirOrder) {
  const int ranks = 3;
  const size_t n = 4096;
  std::atomic<int> lanes{0};
  testing::runRanks(ranks, [&](Communicator& comm) {
    std::vector<float> x(n), y(n);
    for (size_t i = 0; i < n; ++i) {
      x[i] = static_cast<float>((i % 5) + comm.rank());
      y[i] = static_cast<float>(i % 3);
    }
    AllreduceOptions f16;
    f16.wire = DataType::kFloat16;
    std::vector<Work> works;
    works.push_back(comm.allreduceAsync(tensor(x.data(), n), f16));      // x: sum
    works.push_back(comm.allreduceAsync(tensor(y.data(), n), f16));      // y: sum
    works.push_back(comm.allreduceAsync(tensor(x.data(), n / 2), f16));  // x's front again
    works.push_back(comm.allreduceAsync(tensor(y.data(), n)));           // y: float32 wire
    works.push_back(comm.allreduceAsync(tensor(x.data() + n / 4, n / 2), f16));
    for (Work& w : works) w.wait();
    if (comm.rank() == 0) lanes = threadsNamed("gflow-host");
    comm.barrier();
    // The reference, op by op in float64.
    const double r = ranks;
    const double rankSum = ranks * (ranks - 1) / 2.0;
    for (size_t i = 0; i < n; ++i) {
      double xi = r * (i % 5) + rankSum;
      if (i < n / 2) xi *= r;
      if (i >= n / 4 && i < n / 4 + n / 2) xi *= r;
      const double yi = r * r * (i % 3);
      ASSERT_EQ(x[i], xi) << "x[" << i << "] on rank " << comm.rank();
      ASSERT_EQ(y[i], yi) << "y[" << i << "] on rank " << comm.rank();
    }
  });
  // Each rank's host steps ran on its lane.
  EXPECT_GE(lanes.load(), 1);
}

// With residuals (qint8 error feedback) and an in-place prescale, whose
// first steps write the caller's memory: async ops queued at once give the
// bits of the same ops run one at a time, results and residuals alike.
TEST(HostLaneAllreduce, AsyncOpsWithResidualsAndPrescaleGiveTheBitsOfOneAtATime) {
  const int ranks = 3;
  const size_t n = 50000;
  struct Buffers {
    std::vector<float> x, y, rx;
  };
  auto run = [&](bool async) {
    std::vector<Buffers> out(ranks);
    testing::runRanks(ranks, [&](Communicator& comm) {
      Buffers b;
      std::mt19937 rng(static_cast<uint32_t>(77 + comm.rank()));
      std::normal_distribution<float> d(0.0f, 1.0f);
      for (size_t i = 0; i < n; ++i) {
        b.x.push_back(d(rng));
        b.y.push_back(d(rng));
      }
      b.rx.assign(n, 0.0f);
      AllreduceOptions q8, f16, scaled;
      q8.wire = DataType::kQInt8;
      q8.op = ReduceOp::kAvg;
      q8.residual = tensor(b.rx.data(), n);
      f16.wire = DataType::kFloat16;
      scaled.prescale = 0.5f;
      scaled.postscale = 2.0f;
      const std::vector<std::pair<Tensor, AllreduceOptions>> ops = {
          {tensor(b.x.data(), n), q8},
          {tensor(b.y.data(), n), f16},
          {tensor(b.x.data(), n), q8},
          {tensor(b.y.data(), n), scaled},
          {tensor(b.x.data(), n), scaled}};
      std::vector<Work> works;
      for (const auto& [t, o] : ops) {
        if (async) {
          works.push_back(comm.allreduceAsync(t, o));
        } else {
          comm.allreduce(t, o);
        }
      }
      for (Work& w : works) w.wait();
      out[comm.rank()] = std::move(b);
    });
    return out;
  };
  const std::vector<Buffers> one = run(false), queued = run(true);
  for (int r = 0; r < ranks; ++r) {
    EXPECT_EQ(std::memcmp(one[r].x.data(), queued[r].x.data(), n * sizeof(float)), 0) << r;
    EXPECT_EQ(std::memcmp(one[r].y.data(), queued[r].y.data(), n * sizeof(float)), 0) << r;
    EXPECT_EQ(std::memcmp(one[r].rx.data(), queued[r].rx.data(), n * sizeof(float)), 0) << r;
  }
}

}  // namespace
}  // namespace gflow
