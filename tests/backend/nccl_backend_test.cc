// The NCCL backend on the software CUDA and NCCL (tests/testing/soft_cuda.h,
// soft_nccl.h): choosing NCCL or staging, every collective against a float64
// or exact reference, split and the hierarchical allreduce on NCCL
// communicators, and the failure paths (deadline, mismatch, asynchronous
// error, abort) ending in gflow::Error on every rank instead of a hang.
// Ranks are threads, each on its own soft GPU unless a test shares one.
#include <gtest/gtest.h>

#include <atomic>
#include <cmath>
#include <cstdlib>
#include <cstring>
#include <functional>
#include <string>
#include <thread>
#include <vector>

#include "common/params.h"
#include "cuda/nccl_api.h"
#include "gflow/gflow.h"
#include "testing/ranks.h"
#include "testing/soft_cuda.h"
#include "testing/soft_nccl.h"
#include "testing/values.h"

namespace gflow {
namespace {

namespace softcuda = testing::softcuda;
namespace softnccl = testing::softnccl;
using std::chrono::milliseconds;

// Device memory of the soft GPU `device`, freed with the object.
class DeviceBuffer {
 public:
  DeviceBuffer(int device, size_t bytes) : device_(device), p_(softcuda::alloc(device, bytes)) {}
  ~DeviceBuffer() { softcuda::free(p_); }
  DeviceBuffer(const DeviceBuffer&) = delete;
  DeviceBuffer& operator=(const DeviceBuffer&) = delete;
  template <typename T>
  T* as() {
    return static_cast<T*>(p_);
  }
  Tensor tensor(size_t count, DataType dt, size_t offsetElems = 0) {
    return Tensor(static_cast<char*>(p_) + offsetElems * dataTypeSize(dt), count, dt,
                  Device{DeviceType::kCUDA, device_});
  }

 private:
  int device_;
  void* p_;
};

// Options of a world whose ranks give up after `ms`.
Options within(int64_t ms) {
  Options o;
  o.timeout = milliseconds(ms);
  return o;
}

class NcclBackendTest : public ::testing::Test {
 protected:
  void SetUp() override {
    softcuda::install(4);
    softnccl::enable();
  }
  void TearDown() override {
    for (const char* v : {"GFLOW_DEVICE_BACKEND", "GFLOW_NCCL_VERIFY", "GFLOW_NCCL_P2P"}) {
      unsetenv(v);
    }
    params::resetCacheForTesting();
    // Communicators gone: gflow freed every device and pinned buffer.
    EXPECT_EQ(softcuda::allocationsAlive(), 0);
    EXPECT_EQ(softcuda::hostAllocsAlive(), 0);
    softcuda::uninstall();
  }
  static void setParam(const char* name, const char* value) {
    setenv(name, value, 1);
    params::resetCacheForTesting();
  }
};

// Makes NCCL report `result` as the asynchronous error of every live NCCL
// communicator on soft GPU `device` (the rank that uses it).
void injectOnDevice(int device, int result) {
  for (const auto& info : softnccl::comms()) {
    if (info.device == device) softnccl::injectAsyncError(info.comm, result);
  }
}

// Rank r's value at i: exact in every dtype used below.
double valueAt(int r, size_t i) {
  return static_cast<double>((r + 1) * 3 + static_cast<int>(i % 7)) - 4.0;
}

TEST_F(NcclBackendTest, AllreduceRunsOnNcclAndMatchesAFloat64Reference) {
  constexpr int kRanks = 3;
  constexpr size_t kCount = 1000;
  testing::runRanks(kRanks, [&](Communicator& c) {
    const int r = c.rank();
    DeviceBuffer buf(r, kCount * 8), out(r, kCount * 8);
    // float32 sum, in place.
    for (size_t i = 0; i < kCount; ++i) buf.as<float>()[i] = static_cast<float>(valueAt(r, i));
    c.allreduce(buf.tensor(kCount, DataType::kFloat32));
    for (size_t i = 0; i < kCount; ++i) {
      double want = 0;
      for (int q = 0; q < kRanks; ++q) want += valueAt(q, i);
      ASSERT_EQ(buf.as<float>()[i], static_cast<float>(want)) << i;
    }
    // int64 max, out of place.
    for (size_t i = 0; i < kCount; ++i) buf.as<int64_t>()[i] = (r * 7919 + int64_t(i) * 31) % 101;
    c.allreduce(buf.tensor(kCount, DataType::kInt64), out.tensor(kCount, DataType::kInt64),
                ReduceOp::kMax);
    for (size_t i = 0; i < kCount; ++i) {
      int64_t want = 0;
      for (int q = 0; q < kRanks; ++q) want = std::max<int64_t>(want, (q * 7919 + i * 31) % 101);
      ASSERT_EQ(out.as<int64_t>()[i], want) << i;
    }
    // float64 avg.
    for (size_t i = 0; i < kCount; ++i) buf.as<double>()[i] = valueAt(r, i);
    c.allreduce(buf.tensor(kCount, DataType::kFloat64), ReduceOp::kAvg);
    for (size_t i = 0; i < kCount; ++i) {
      double want = 0;
      for (int q = 0; q < kRanks; ++q) want += valueAt(q, i);
      ASSERT_NEAR(buf.as<double>()[i], want / kRanks, 1e-12) << i;
    }
  });
  EXPECT_EQ(softnccl::inits(), kRanks);
  EXPECT_EQ(softnccl::collectivesRun(), 3 * kRanks);
  EXPECT_EQ(softcuda::hostAllocs(), 0u) << "NCCL ops must not stage through host memory";
}

// What gflow asks of CUDA around a device allreduce, counted on the
// software CUDA: after the first ops no event is created or destroyed (the
// communicator's EventPool lends them), each distinct buffer is looked up
// once (an in-place call passes one buffer twice), and in and out on one
// stream share one event. The results stay exact while events are reused,
// also with more ops in flight than the pool keeps, and the last event goes
// with the communicator.
TEST_F(NcclBackendTest, ADeviceAllreduceReusesItsEventsAndLooksUpEachBufferOnce) {
  constexpr int kRanks = 2, kOps = 20, kInFlight = 100;
  constexpr size_t kCount = 256;
  struct Counts {
    uint64_t create, destroy, record, lookup;
  };
  const auto now = [] {
    return Counts{softcuda::calls("eventCreate"), softcuda::calls("eventDestroy"),
                  softcuda::calls("eventRecord"), softcuda::calls("pointerDevice")};
  };
  Counts start{}, inPlace{}, outOfPlace{};
  testing::runRanks(kRanks, [&](Communicator& c) {
    const int r = c.rank();
    DeviceBuffer buf(r, kCount * 4), out(r, kCount * 4);
    const Tensor t = buf.tensor(kCount, DataType::kFloat32);
    const Tensor o = out.tensor(kCount, DataType::kFloat32);
    for (int i = 0; i < 3; ++i) c.allreduce(t, o);  // the pool's first events
    c.barrier();
    if (r == 0) start = now();
    c.barrier();
    for (int i = 0; i < kOps; ++i) c.allreduce(t);
    c.barrier();
    if (r == 0) inPlace = now();
    c.barrier();
    for (int i = 0; i < kOps; ++i) {
      for (size_t k = 0; k < kCount; ++k) buf.as<float>()[k] = static_cast<float>(r + i + k);
      c.allreduce(t, o);
      for (size_t k = 0; k < kCount; ++k) {
        ASSERT_EQ(out.as<float>()[k], static_cast<float>(1 + 2 * (i + k))) << i << " " << k;
      }
    }
    c.barrier();
    if (r == 0) outOfPlace = now();
    c.barrier();
    // More ops in flight than the pool keeps: each holds its own event.
    DeviceBuffer many(r, kInFlight * sizeof(float));
    std::vector<Work> works;
    for (int i = 0; i < kInFlight; ++i) {
      many.as<float>()[i] = static_cast<float>(i * (r + 1));
      works.push_back(c.allreduceAsync(many.tensor(1, DataType::kFloat32, i)));
    }
    for (int i = 0; i < kInFlight; ++i) {
      works[i].wait();
      ASSERT_EQ(many.as<float>()[i], static_cast<float>(3 * i)) << i;
    }
  });
  const uint64_t ops = uint64_t(kRanks) * kOps;
  EXPECT_EQ(inPlace.create - start.create, 0u);
  EXPECT_EQ(inPlace.destroy - start.destroy, 0u);
  EXPECT_EQ(inPlace.lookup - start.lookup, ops) << "one buffer, looked up once per op";
  EXPECT_EQ(outOfPlace.create - inPlace.create, 0u);
  EXPECT_EQ(outOfPlace.destroy - inPlace.destroy, 0u);
  EXPECT_EQ(outOfPlace.lookup - inPlace.lookup, 2 * ops) << "in and out, once each";
  // One record for the op's inputs (in and out share their stream) and one
  // after the NCCL op, in place or not.
  EXPECT_EQ(inPlace.record - start.record, 2 * ops);
  EXPECT_EQ(outOfPlace.record - inPlace.record, 2 * ops);
  EXPECT_EQ(softcuda::eventsAlive(), 0) << "the communicators' events went with them";
}

// Every dtype and op on device buffers against the exact reference: NCCL
// runs the types and ops it has (int8 and float8 included); int16, bool,
// complex and the bitwise ops are staged through host memory, with the same
// results.
TEST_F(NcclBackendTest, EveryDtypeAndOpIsExactOnNcclOrStaged) {
  constexpr int kRanks = 3;
  constexpr size_t kCount = 257;
  std::atomic<int> expectedOnNccl{0};
  testing::runRanks(kRanks, [&](Communicator& c) {
    const int r = c.rank();
    DeviceBuffer buf(r, kCount * 16);
    for (DataType t : testing::allDataTypes()) {
      for (ReduceOp op : testing::allReduceOps()) {
        if (!supportsReduceOp(t, op)) continue;
        const bool nccl = t != DataType::kInt16 && t != DataType::kBool &&
                          t != DataType::kComplex64 && t != DataType::kComplex128 &&
                          op != ReduceOp::kBand && op != ReduceOp::kBor && op != ReduceOp::kBxor;
        if (nccl && r == 0) ++expectedOnNccl;
        for (size_t i = 0; i < kCount; ++i) {
          testing::setValue(buf.as<char>(), i, t, testing::exactInput(r, i, op, t));
        }
        c.allreduce(buf.tensor(kCount, t), op);
        for (size_t i = 0; i < kCount; ++i) {
          ASSERT_EQ(testing::getValue(buf.as<char>(), i, t),
                    testing::exactExpected(kRanks, i, op, t))
              << toString(t) << " " << toString(op) << " element " << i << " rank " << r;
        }
      }
    }
  });
  EXPECT_EQ(softnccl::collectivesRun(), expectedOnNccl * kRanks);
  EXPECT_GT(softcuda::hostAllocs(), 0u) << "the types NCCL lacks are staged";
}

// Data movement needs no NCCL type: allgather and broadcast of types NCCL
// cannot reduce (complex128, bool, int16) run on NCCL as bytes, exact.
TEST_F(NcclBackendTest, DataMovementOfTypesNcclCannotReduceRunsOnNccl) {
  constexpr int kRanks = 3;
  constexpr size_t kCount = 101;
  testing::runRanks(kRanks, [&](Communicator& c) {
    const int r = c.rank();
    DeviceBuffer in(r, kCount * 16), out(r, kCount * 16 * kRanks);
    for (DataType t : {DataType::kComplex128, DataType::kBool, DataType::kInt16}) {
      const size_t es = dataTypeSize(t);
      for (size_t i = 0; i < kCount * es; ++i) in.as<uint8_t>()[i] = uint8_t(r * 31 + i);
      c.allgather(in.tensor(kCount, t), out.tensor(kCount * kRanks, t));
      for (int q = 0; q < kRanks; ++q) {
        for (size_t i = 0; i < kCount * es; ++i) {
          ASSERT_EQ(out.as<uint8_t>()[q * kCount * es + i], uint8_t(q * 31 + i)) << toString(t);
        }
      }
      c.broadcast(in.tensor(kCount, t), 2);
      for (size_t i = 0; i < kCount * es; ++i) {
        ASSERT_EQ(in.as<uint8_t>()[i], uint8_t(2 * 31 + i)) << toString(t);
      }
    }
  });
  EXPECT_EQ(softnccl::collectivesRun(), 6 * kRanks);
  EXPECT_EQ(softcuda::hostAllocs(), 0u) << "nothing staged through host memory";
}

TEST_F(NcclBackendTest, ReduceScatterAllgatherAndBroadcastRunOnNccl) {
  constexpr int kRanks = 3;
  constexpr size_t kBlock = 37;
  testing::runRanks(kRanks, [&](Communicator& c) {
    const int r = c.rank();
    DeviceBuffer big(r, kBlock * kRanks * 4), small(r, kBlock * 4);
    float* b = big.as<float>();
    float* s = small.as<float>();
    for (size_t i = 0; i < kBlock * kRanks; ++i) b[i] = static_cast<float>(valueAt(r, i));
    c.reduceScatter(big.tensor(kBlock * kRanks, DataType::kFloat32),
                    small.tensor(kBlock, DataType::kFloat32));
    for (size_t i = 0; i < kBlock; ++i) {
      double want = 0;
      for (int q = 0; q < kRanks; ++q) want += valueAt(q, r * kBlock + i);
      ASSERT_EQ(s[i], static_cast<float>(want)) << i;
    }
    // Allgather out of place, then in place (in = this rank's block of out).
    for (size_t i = 0; i < kBlock; ++i) s[i] = static_cast<float>(r * 1000 + i);
    c.allgather(small.tensor(kBlock, DataType::kFloat32),
                big.tensor(kBlock * kRanks, DataType::kFloat32));
    for (int q = 0; q < kRanks; ++q) {
      for (size_t i = 0; i < kBlock; ++i) ASSERT_EQ(b[q * kBlock + i], float(q * 1000 + i));
    }
    std::memset(b, 0, kBlock * kRanks * 4);
    for (size_t i = 0; i < kBlock; ++i) b[r * kBlock + i] = static_cast<float>(r - 7.0 * i);
    c.allgather(big.tensor(kBlock, DataType::kFloat32, r * kBlock),
                big.tensor(kBlock * kRanks, DataType::kFloat32));
    for (int q = 0; q < kRanks; ++q) {
      for (size_t i = 0; i < kBlock; ++i) ASSERT_EQ(b[q * kBlock + i], float(q - 7.0 * i));
    }
    for (size_t i = 0; i < kBlock; ++i) s[i] = r == 1 ? static_cast<float>(i) * 0.5f : -1.0f;
    c.broadcast(small.tensor(kBlock, DataType::kFloat32), 1);
    for (size_t i = 0; i < kBlock; ++i) ASSERT_EQ(s[i], static_cast<float>(i) * 0.5f);
  });
  EXPECT_EQ(softnccl::collectivesRun(), 4 * kRanks);
}

TEST_F(NcclBackendTest, RanksSharingAGpuAreStagedThroughHostMemory) {
  testing::runRanks(2, [&](Communicator& c) {
    DeviceBuffer buf(0, 64 * 4);
    for (int i = 0; i < 64; ++i) buf.as<float>()[i] = static_cast<float>(c.rank() + i);
    c.allreduce(buf.tensor(64, DataType::kFloat32));
    for (int i = 0; i < 64; ++i) ASSERT_EQ(buf.as<float>()[i], static_cast<float>(1 + 2 * i));
  });
  EXPECT_EQ(softnccl::inits(), 0);
  EXPECT_GT(softcuda::hostAllocs(), 0u);
}

TEST_F(NcclBackendTest, StagedWhenConfiguredSo) {
  setParam("GFLOW_DEVICE_BACKEND", "staged");
  testing::runRanks(2, [&](Communicator& c) {
    DeviceBuffer buf(c.rank(), 16 * 4);
    for (int i = 0; i < 16; ++i) buf.as<float>()[i] = 1.0f;
    c.allreduce(buf.tensor(16, DataType::kFloat32));
    EXPECT_EQ(buf.as<float>()[15], 2.0f);
  });
  EXPECT_EQ(softnccl::inits(), 0);
}

TEST_F(NcclBackendTest, RequiringNcclWhereItCannotRunFailsOnEveryRank) {
  setParam("GFLOW_DEVICE_BACKEND", "nccl");
  auto errors = testing::runRanksCollect(2, [&](Communicator& c) {
    DeviceBuffer buf(0, 16 * 4);
    c.allreduce(buf.tensor(16, DataType::kFloat32));
  });
  for (int r = 0; r < 2; ++r) {
    ASSERT_TRUE(errors[r]) << "rank " << r;
    try {
      std::rethrow_exception(errors[r]);
    } catch (const Error& e) {
      EXPECT_EQ(e.code(), ErrorCode::kInvalidArgument) << e.what();
      EXPECT_NE(std::string(e.what()).find("use the same GPU"), std::string::npos) << e.what();
    }
  }
}

TEST_F(NcclBackendTest, TensorsOnAnotherGpuThanTheNcclCommunicatorAreRejected) {
  auto errors = testing::runRanksCollect(2, [&](Communicator& c) {
    DeviceBuffer a(c.rank(), 16 * 4), b(2 + c.rank(), 16 * 4);
    c.allreduce(a.tensor(16, DataType::kFloat32));
    c.allreduce(b.tensor(16, DataType::kFloat32));
  });
  for (int r = 0; r < 2; ++r) {
    ASSERT_TRUE(errors[r]) << "rank " << r;
    try {
      std::rethrow_exception(errors[r]);
    } catch (const Error& e) {
      // Each rank's own check fires first, or it hears of its peer's.
      if (e.code() == ErrorCode::kInvalidArgument) {
        EXPECT_NE(std::string(e.what()).find("runs NCCL on cuda:"), std::string::npos) << e.what();
      } else {
        EXPECT_EQ(e.code(), ErrorCode::kPeerLost) << e.what();
      }
    }
  }
}

// Collects rank r's error code (or fails when the rank succeeded).
ErrorCode codeOf(const std::exception_ptr& e, std::string* what = nullptr) {
  if (!e) return static_cast<ErrorCode>(255);
  try {
    std::rethrow_exception(e);
  } catch (const Error& err) {
    if (what) *what = err.what();
    return err.code();
  }
}

// Three ranks run `op` once on NCCL; then ranks 0 and 1 run it again and
// rank 2 does not (within 1.5 s). The first rank past its deadline aborts
// NCCL; the other one times out too or hears of it first (NCCL's remote
// error). A timeout names `waited` (the NCCL call).
void expectARankThatNeverCallsToEndInATimeout(const std::function<void(Communicator&)>& op,
                                              const char* waited) {
  std::atomic<int> done{0};
  auto errors = testing::runRanksCollect(
      3,
      [&](Communicator& c) {
        op(c);
        if (c.rank() == 2) {
          while (done.load() < 2) std::this_thread::sleep_for(milliseconds(5));
          return;
        }
        try {
          op(c);
        } catch (...) {
          ++done;
          throw;
        }
        ++done;
      },
      within(1500));
  int timeouts = 0;
  for (int r = 0; r < 2; ++r) {
    std::string what;
    const ErrorCode code = codeOf(errors[r], &what);
    if (code == ErrorCode::kTimeout) {
      ++timeouts;
      EXPECT_NE(what.find(std::string(waited) + " did not complete within the deadline"),
                std::string::npos)
          << what;
    } else {
      EXPECT_EQ(code, ErrorCode::kPeerLost) << r << ": " << what;
    }
  }
  EXPECT_GE(timeouts, 1);
  EXPECT_FALSE(errors[2]);
  EXPECT_GE(softnccl::aborts(), 2);
}

TEST_F(NcclBackendTest, ARankThatNeverCallsEndsInATimeoutAndAbortsNccl) {
  setParam("GFLOW_NCCL_VERIFY", "0");  // the wait is inside NCCL, not in the check
  expectARankThatNeverCallsToEndInATimeout(
      [](Communicator& c) {
        DeviceBuffer buf(c.rank(), 16 * 4);
        c.allreduce(buf.tensor(16, DataType::kFloat32));
      },
      "ncclAllReduce");
}

// The op check runs beside the NCCL op: the mismatched kernels hang, as in
// NCCL, until the check's verdict aborts them on every rank.
TEST_F(NcclBackendTest, DifferentOpsAreAMismatchAndNcclIsAborted) {
  auto errors = testing::runRanksCollect(
      3,
      [&](Communicator& c) {
        DeviceBuffer buf(c.rank(), 64 * 4);
        c.allreduce(buf.tensor(c.rank() == 1 ? 32 : 64, DataType::kFloat32));
      },
      within(20000));
  for (int r = 0; r < 3; ++r) {
    std::string what;
    const ErrorCode code = codeOf(errors[r], &what);
    EXPECT_TRUE(code == ErrorCode::kMismatch || code == ErrorCode::kPeerLost) << r << ": " << what;
  }
  EXPECT_EQ(softnccl::collectivesRun(), 0) << "no rank may complete the mismatched op";
  EXPECT_GE(softnccl::aborts(), 1) << "the check must abort NCCL";
}

TEST_F(NcclBackendTest, AnAsynchronousNcclErrorFailsTheRankAndItsPeers) {
  setParam("GFLOW_NCCL_VERIFY", "0");
  auto errors = testing::runRanksCollect(
      3,
      [&](Communicator& c) {
        DeviceBuffer buf(c.rank(), 16 * 4);
        c.allreduce(buf.tensor(16, DataType::kFloat32));
        if (c.rank() == 1) {
          injectOnDevice(1, nccl::kRemoteError);
        } else {
          std::this_thread::sleep_for(milliseconds(50));
        }
        c.allreduce(buf.tensor(16, DataType::kFloat32));
      },
      within(20000));
  for (int r = 0; r < 3; ++r) {
    std::string what;
    EXPECT_EQ(codeOf(errors[r], &what), ErrorCode::kPeerLost) << r << ": " << what;
    if (r == 1) {
      EXPECT_NE(what.find("ncclAllReduce failed"), std::string::npos) << what;
    }
  }
}

TEST_F(NcclBackendTest, AbortEndsAWaitInsideNccl) {
  setParam("GFLOW_NCCL_VERIFY", "0");
  auto world = testing::makeWorld(2, within(60000));
  std::atomic<bool> rank0Done{false};
  std::string what;
  ErrorCode code = ErrorCode::kInternal;
  std::thread aborter;
  testing::forEachRank(world, [&](Communicator& c) {
    DeviceBuffer buf(c.rank(), 16 * 4);
    c.allreduce(buf.tensor(16, DataType::kFloat32));
    if (c.rank() == 1) {
      while (!rank0Done.load()) std::this_thread::sleep_for(milliseconds(5));
      return;
    }
    aborter = std::thread([&c] {
      std::this_thread::sleep_for(milliseconds(200));
      c.abort();
    });
    try {
      c.allreduce(buf.tensor(16, DataType::kFloat32));
    } catch (const Error& e) {
      code = e.code();
      what = e.what();
    }
    rank0Done = true;
  });
  aborter.join();
  EXPECT_EQ(code, ErrorCode::kAborted) << what;
}

// ncclReduce for what NCCL can reduce; gather, scatter and all-to-all as
// grouped ncclSend/ncclRecv: no host staging, exact against the reference.
// A reduction NCCL has no type for (int16) is staged, with the same result.
TEST_F(NcclBackendTest, RootedOpsAndAlltoallRunOnNccl) {
  constexpr int kRanks = 3, kRoot = 2;
  constexpr size_t kBlock = 41;
  testing::runRanks(kRanks, [&](Communicator& c) {
    const int r = c.rank();
    DeviceBuffer in(r, kBlock * kRanks * 8), out(r, kBlock * kRanks * 8);
    float* x = in.as<float>();
    float* y = out.as<float>();
    for (size_t i = 0; i < kBlock; ++i) x[i] = static_cast<float>(valueAt(r, i));
    std::fill(y, y + kBlock, -1.0f);
    c.reduce(in.tensor(kBlock, DataType::kFloat32), out.tensor(kBlock, DataType::kFloat32), kRoot,
             ReduceOp::kSum);
    for (size_t i = 0; i < kBlock; ++i) {
      double want = 0;
      for (int q = 0; q < kRanks; ++q) want += valueAt(q, i);
      ASSERT_EQ(y[i], r == kRoot ? static_cast<float>(want) : -1.0f) << i;
    }
    c.gather(in.tensor(kBlock, DataType::kFloat32), out.tensor(kBlock * kRanks, DataType::kFloat32),
             kRoot);
    for (int q = 0; q < kRanks && r == kRoot; ++q) {
      for (size_t i = 0; i < kBlock; ++i) ASSERT_EQ(y[q * kBlock + i], float(valueAt(q, i)));
    }
    for (size_t i = 0; i < kBlock * kRanks; ++i) x[i] = static_cast<float>(r * 10000 + i);
    c.scatter(in.tensor(kBlock * kRanks, DataType::kFloat32),
              out.tensor(kBlock, DataType::kFloat32), kRoot);
    for (size_t i = 0; i < kBlock; ++i) ASSERT_EQ(y[i], float(kRoot * 10000 + r * kBlock + i));
    EXPECT_EQ(c.stats().stagedOps, 0u);
    c.alltoall(in.tensor(kBlock * kRanks, DataType::kFloat32),
               out.tensor(kBlock * kRanks, DataType::kFloat32));
    for (int q = 0; q < kRanks; ++q) {
      for (size_t i = 0; i < kBlock; ++i) {
        ASSERT_EQ(y[q * kBlock + i], float(q * 10000 + r * kBlock + i)) << q;
      }
    }
    EXPECT_EQ(c.stats().stagedOps, 0u);
    int16_t* a = in.as<int16_t>();
    int16_t* b = out.as<int16_t>();
    for (size_t i = 0; i < kBlock; ++i) a[i] = int16_t(r * 100 - int(i));
    c.reduce(in.tensor(kBlock, DataType::kInt16), out.tensor(kBlock, DataType::kInt16), kRoot,
             ReduceOp::kMin);
    for (size_t i = 0; i < kBlock && r == kRoot; ++i) ASSERT_EQ(b[i], int16_t(-int(i)));
    EXPECT_EQ(c.stats().ncclOps, 4u);
    EXPECT_EQ(c.stats().stagedOps, 1u);
  });
  EXPECT_EQ(softnccl::collectivesRun(), 4 * kRanks);
}

// Rank 1 expects another count from rank 0 than rank 0 sends: the check
// beside the NCCL op finds the pair on every rank and aborts NCCL.
TEST_F(NcclBackendTest, AlltoallvCountsThatDisagreeAreAMismatchOnEveryRank) {
  constexpr int kRanks = 3;
  auto errors = testing::runRanksCollect(
      kRanks,
      [&](Communicator& c) {
        const int r = c.rank();
        DeviceBuffer in(r, 64 * 4), out(r, 64 * 4);
        c.allreduce(in.tensor(4, DataType::kFloat32));  // NCCL starts
        std::vector<size_t> counts(kRanks, 5), offsets = {0, 5, 10};
        std::vector<size_t> outCounts = counts;
        if (r == 1) outCounts[0] = 6;
        std::vector<size_t> outOffsets = {0, 6, 12};
        c.alltoallv(in.tensor(15, DataType::kFloat32), counts, offsets,
                    out.tensor(18, DataType::kFloat32), outCounts, outOffsets);
      },
      within(20000));
  for (int r = 0; r < kRanks; ++r) {
    std::string what;
    EXPECT_EQ(codeOf(errors[r], &what), ErrorCode::kMismatch) << r << ": " << what;
    EXPECT_NE(what.find("rank 0 sends 5 elements to rank 1, which expects 6"), std::string::npos)
        << what;
  }
  EXPECT_EQ(softnccl::collectivesRun(), kRanks) << "only the first allreduce ran on NCCL";
  EXPECT_GE(softnccl::aborts(), 1) << "the check must abort NCCL";
}

// A rank that never calls the all-to-all, and one whose NCCL fails inside
// it: deadline or peer_lost on the others, no hang.
TEST_F(NcclBackendTest, AlltoallWithAMissingOrFailingRankEndsInAnError) {
  setParam("GFLOW_NCCL_VERIFY", "0");  // the wait is inside NCCL, not in the check
  expectARankThatNeverCallsToEndInATimeout(
      [](Communicator& c) {
        DeviceBuffer in(c.rank(), 30 * 4), out(c.rank(), 30 * 4);
        c.alltoall(in.tensor(30, DataType::kFloat32), out.tensor(30, DataType::kFloat32));
      },
      "all-to-all (grouped ncclSend/ncclRecv)");

  softnccl::enable();  // a fresh software NCCL for the second case
  softnccl::setAbortReleasesPeers(false);
  auto errors = testing::runRanksCollect(
      3,
      [&](Communicator& c) {
        DeviceBuffer in(c.rank(), 30 * 4), out(c.rank(), 30 * 4);
        c.alltoall(in.tensor(30, DataType::kFloat32), out.tensor(30, DataType::kFloat32));
        if (c.rank() == 1) injectOnDevice(1, nccl::kSystemError);
        c.alltoall(in.tensor(30, DataType::kFloat32), out.tensor(30, DataType::kFloat32));
      },
      within(30000));
  for (int r = 0; r < 3; ++r) {
    std::string what;
    EXPECT_EQ(codeOf(errors[r], &what), ErrorCode::kPeerLost) << r << ": " << what;
    if (r != 1) {
      EXPECT_NE(what.find("rank 1 failed"), std::string::npos) << what;
    }
  }
}

// ---- point-to-point through NCCL (GFLOW_NCCL_P2P=1) ------------------------

// Rank r's message for its peer, 1000 + r * 100 + i (exact in float32).
void fillFrom(DeviceBuffer& b, int r, size_t n, int salt = 0) {
  for (size_t i = 0; i < n; ++i) b.as<float>()[i] = float(1000 * (salt + 1) + r * 100 + int(i));
}
bool holdsFrom(DeviceBuffer& b, int r, size_t n, int salt = 0) {
  for (size_t i = 0; i < n; ++i) {
    if (b.as<float>()[i] != float(1000 * (salt + 1) + r * 100 + int(i))) return false;
  }
  return true;
}

TEST_F(NcclBackendTest, PointToPointRunsOnNcclOneGroupPerCall) {
  setParam("GFLOW_NCCL_P2P", "1");
  constexpr int kRanks = 3;
  constexpr size_t n = 50;
  testing::runRanks(kRanks, [&](Communicator& c) {
    const int r = c.rank(), right = (r + 1) % kRanks, left = (r + kRanks - 1) % kRanks;
    DeviceBuffer a(r, n * 4), b(r, n * 4), d(r, n * 4);
    c.allreduce(a.tensor(n, DataType::kFloat32));  // NCCL starts
    const uint64_t runs = c.stats().ncclOps;
    // A ring: every rank sends before it receives, in one call.
    fillFrom(a, r, n);
    c.sendRecv({P2POp::send(a.tensor(n, DataType::kFloat32), right),
                P2POp::recv(b.tensor(n, DataType::kFloat32), left)});
    EXPECT_TRUE(holdsFrom(b, left, n)) << r;
    // Two tags from rank 0 to rank 1 in one call; rank 1 takes them in one
    // call in the other order, one from any source.
    if (r == 0) {
      fillFrom(a, 0, n, 5);
      fillFrom(d, 0, n, 7);
      c.sendRecv({P2POp::send(a.tensor(n, DataType::kFloat32), 1, 5),
                  P2POp::send(d.tensor(n, DataType::kFloat32), 1, 7)});
    } else if (r == 1) {
      int source = -1;
      c.sendRecv({P2POp::recv(b.tensor(n, DataType::kFloat32), P2POp::kAnySource, 7, &source),
                  P2POp::recv(d.tensor(n, DataType::kFloat32), 0, 5)});
      EXPECT_EQ(source, 0);
      EXPECT_TRUE(holdsFrom(b, 0, n, 7));
      EXPECT_TRUE(holdsFrom(d, 0, n, 5));
    }
    // Async send then receive across calls in the order sent; a message of
    // no elements; then an NCCL collective after them.
    if (r == 2) {
      fillFrom(a, 2, n, 1);
      Work w1 = c.sendAsync(a.tensor(n, DataType::kFloat32), 0, 3);
      Work w2 = c.sendAsync(d.tensor(0, DataType::kFloat32), 0, 4);
      w1.wait();
      w2.wait();
    } else if (r == 0) {
      Work w1 = c.recvAsync(b.tensor(n, DataType::kFloat32), 2, 3);
      EXPECT_EQ(c.recv(d.tensor(0, DataType::kFloat32), P2POp::kAnySource, 4), 2);
      w1.wait();
      EXPECT_TRUE(holdsFrom(b, 2, n, 1));
    }
    c.allreduce(a.tensor(n, DataType::kFloat32));
    // Host buffers still go through the host.
    std::vector<float> h(n, float(r)), got(n, -1.0f);
    c.sendRecv({P2POp::send(tensor(h.data(), n), right), P2POp::recv(tensor(got.data(), n), left)});
    EXPECT_EQ(got, std::vector<float>(n, float(left)));
    const uint64_t p2p = r == 0 ? 4 : r == 1 ? 2 : 3;  // NCCL point-to-point calls
    EXPECT_EQ(c.stats().ncclOps - runs, p2p + 1) << r;
    EXPECT_EQ(c.stats().stagedOps, 0u) << r;
  });
  EXPECT_EQ(softcuda::hostAllocs(), 0u) << "nothing staged through host memory";
}

// Each case: rank 0 runs `send`, rank 1 `recv`, rank 2 only starts NCCL;
// rank 1 raises `code` with `what` in its message, rank 0 an error.
void expectP2PFailure(const std::function<void(Communicator&, DeviceBuffer&)>& send,
                      const std::function<void(Communicator&, DeviceBuffer&)>& recv, ErrorCode code,
                      const std::string& what) {
  auto errors = testing::runRanksCollect(
      3,
      [&](Communicator& c) {
        DeviceBuffer buf(c.rank(), 64 * 4);
        c.allreduce(buf.tensor(4, DataType::kFloat32));
        if (c.rank() == 0) send(c, buf);
        if (c.rank() == 1) recv(c, buf);
      },
      within(5000));
  std::string text;
  EXPECT_EQ(codeOf(errors[1], &text), code) << text;
  EXPECT_NE(text.find(what), std::string::npos) << text;
  EXPECT_TRUE(errors[0]) << "the sender must fail too";
}

TEST_F(NcclBackendTest, PointToPointOnNcclMismatchesAreErrorsNotWrongData) {
  setParam("GFLOW_NCCL_P2P", "1");
  // A receive of another size: the header's envelope differs.
  expectP2PFailure(
      [](Communicator& c, DeviceBuffer& b) { c.send(b.tensor(10, DataType::kFloat32), 1); },
      [](Communicator& c, DeviceBuffer& b) { c.recv(b.tensor(12, DataType::kFloat32), 0); },
      ErrorCode::kMismatch, "count=10");
  // A host buffer receiving a device message sent through NCCL.
  expectP2PFailure(
      [](Communicator& c, DeviceBuffer& b) { c.send(b.tensor(10, DataType::kFloat32), 1); },
      [](Communicator& c, DeviceBuffer&) {
        std::vector<float> h(10);
        c.recv(tensor(h.data(), 10), 0);
      },
      ErrorCode::kMismatch, "path=nccl");
  // Receiving a peer's second device message before its first.
  expectP2PFailure(
      [](Communicator& c, DeviceBuffer& b) {
        Work w1 = c.sendAsync(b.tensor(8, DataType::kFloat32), 1, 1);
        Work w2 = c.sendAsync(b.tensor(8, DataType::kFloat32, 8), 1, 2);
        w1.wait();
        w2.wait();
      },
      [](Communicator& c, DeviceBuffer& b) { c.recv(b.tensor(8, DataType::kFloat32), 0, 2); },
      ErrorCode::kMismatch, "device message #1 while its message #0 is not received yet");
}

TEST_F(NcclBackendTest, PointToPointOnNcclRefusesWhatItCannotCarry) {
  setParam("GFLOW_NCCL_P2P", "1");
  auto errors = testing::runRanksCollect(
      2,
      [&](Communicator& c) {
        DeviceBuffer buf(c.rank(), 64 * 4);
        std::vector<float> h(4);
        if (c.rank() == 0) {
          // Before NCCL started, then (it fails the communicator) nothing more.
          c.send(buf.tensor(4, DataType::kFloat32), 1);
        }
      },
      within(5000));
  std::string what;
  EXPECT_EQ(codeOf(errors[0], &what), ErrorCode::kInvalidArgument) << what;
  EXPECT_NE(what.find("call a collective on cuda tensors first"), std::string::npos) << what;

  errors = testing::runRanksCollect(
      2,
      [&](Communicator& c) {
        DeviceBuffer buf(c.rank(), 64 * 4);
        c.allreduce(buf.tensor(4, DataType::kFloat32));
        std::vector<float> h(4);
        if (c.rank() == 0) {
          c.sendRecv({P2POp::send(buf.tensor(4, DataType::kFloat32), 1),
                      P2POp::send(tensor(h.data(), 4), 1, 1)});
        }
      },
      within(5000));
  EXPECT_EQ(codeOf(errors[0], &what), ErrorCode::kInvalidArgument) << what;
  EXPECT_NE(what.find("not all in memory of cuda:0"), std::string::npos) << what;
}

// A device receive still waiting for its header when the rank enters a
// collective: the collective first enqueues it (program order), on NCCL and
// on the host alike, so a sender that waits for that receive is released.
TEST_F(NcclBackendTest, AnEarlierDeviceReceiveStartsBeforeALaterCollective) {
  setParam("GFLOW_NCCL_P2P", "1");
  for (bool cpuCollective : {false, true}) {
    testing::runRanks(2, [&](Communicator& c) {
      DeviceBuffer buf(c.rank(), 64 * 4), got(c.rank(), 64 * 4);
      c.allreduce(buf.tensor(4, DataType::kFloat32));  // NCCL starts
      std::vector<float> h(8, 1.0f);
      auto collective = [&] {
        if (cpuCollective) {
          c.allreduce(tensor(h.data(), h.size()));
        } else {
          c.allreduce(buf.tensor(8, DataType::kFloat32));
        }
      };
      if (c.rank() == 0) {
        Work w = c.recvAsync(got.tensor(16, DataType::kFloat32), 1, 3);
        collective();
        w.wait();
        EXPECT_TRUE(holdsFrom(got, 1, 16));
      } else {
        std::this_thread::sleep_for(milliseconds(200));
        fillFrom(got, 1, 16);
        c.send(got.tensor(16, DataType::kFloat32), 0, 3);
        collective();
      }
    });
  }
}

// A call whose launch fails inside another op (here the collective that
// enqueues it) raises that failure from its own Work too, not a hang.
TEST_F(NcclBackendTest, ACallWhoseLaunchFailsInsideAnotherOpRaisesItsError) {
  setParam("GFLOW_NCCL_P2P", "1");
  std::string workError;
  auto errors = testing::runRanksCollect(
      2,
      [&](Communicator& c) {
        DeviceBuffer buf(c.rank(), 64 * 4);
        c.allreduce(buf.tensor(4, DataType::kFloat32));
        if (c.rank() == 0) {
          Work w1 = c.sendAsync(buf.tensor(8, DataType::kFloat32), 1, 1);
          Work w2 = c.sendAsync(buf.tensor(8, DataType::kFloat32, 8), 1, 2);
          w1.wait();
          w2.wait();
          return;
        }
        Work w = c.recvAsync(buf.tensor(8, DataType::kFloat32), 0, 2);
        try {
          c.allreduce(buf.tensor(4, DataType::kFloat32, 32));
        } catch (const Error&) {
        }
        try {
          w.wait(std::chrono::seconds(10));
        } catch (const Error& e) {
          workError = e.what();
          throw;
        }
      },
      within(5000));
  std::string what;
  EXPECT_EQ(codeOf(errors[1], &what), ErrorCode::kMismatch) << what;
  EXPECT_NE(workError.find("is not received yet"), std::string::npos) << workError;
  EXPECT_TRUE(errors[0]);
}

// The root gathers into, and scatters from, host memory while every rank
// passes a cuda tensor as its own buffer: NCCL runs them, through a device
// copy of the root's buffer. Over the network transport (no shared memory),
// so the op check's messages and the ops' share one wire.
TEST_F(NcclBackendTest, RootedOpsWithAHostBufferOnTheRootRunOnNccl) {
  constexpr size_t n = 20;
  Options o;
  o.shm.enabled = false;
  testing::runRanks(
      3,
      [&](Communicator& c) {
        const int r = c.rank();
        DeviceBuffer in(r, n * 4), dev(r, n * 3 * 4);
        c.allreduce(in.tensor(4, DataType::kFloat32));  // NCCL starts
        fillFrom(in, r, n);
        std::vector<float> out(n * 3, -1.0f);
        c.gather(in.tensor(n, DataType::kFloat32), r == 0 ? tensor(out.data(), n * 3) : Tensor(),
                 0);
        for (int q = 0; q < 3 && r == 0; ++q) {
          for (size_t i = 0; i < n; ++i) ASSERT_EQ(out[q * n + i], float(1000 + q * 100 + int(i)));
        }
        c.scatter(r == 0 ? tensor(out.data(), n * 3) : Tensor(), dev.tensor(n, DataType::kFloat32),
                  0);
        EXPECT_TRUE(holdsFrom(dev, r, n)) << r;
        std::vector<float> sum(n, -1.0f);
        c.reduce(in.tensor(n, DataType::kFloat32), r == 2 ? tensor(sum.data(), n) : Tensor(), 2);
        for (size_t i = 0; i < n && r == 2; ++i) ASSERT_EQ(sum[i], float(3 * 1000 + 300 + 3 * i));
        EXPECT_EQ(c.stats().stagedOps, 0u) << r;
        EXPECT_EQ(c.stats().ncclOps, 4u) << r;
        // cpu rooted ops on the same communicator stay on the host
        std::vector<float> h(n, float(r)), g(n * 3, -1.0f);
        c.gather(tensor(h.data(), n), r == 1 ? tensor(g.data(), n * 3) : Tensor(), 1);
        for (int q = 0; q < 3 && r == 1; ++q) EXPECT_EQ(g[q * n], float(q));
        c.reduce(tensor(h.data(), n), r == 0 ? tensor(g.data(), n) : Tensor(), 0);
        if (r == 0) {
          EXPECT_EQ(g[0], 3.0f);
        }
        EXPECT_EQ(c.stats().ncclOps, 4u) << r;
      },
      o);
}

// Over the network, with more ranks, the alltoallv check names the pair on
// every rank.
TEST_F(NcclBackendTest, AlltoallvCountsThatDisagreeAreNamedOverTheNetwork) {
  constexpr int kRanks = 4;
  Options o = within(20000);
  o.shm.enabled = false;
  auto errors = testing::runRanksCollect(
      kRanks,
      [&](Communicator& c) {
        const int r = c.rank();
        DeviceBuffer in(r, 64 * 4), out(r, 64 * 4);
        c.allreduce(in.tensor(4, DataType::kFloat32));
        std::vector<size_t> counts(kRanks, 3), offsets = {0, 3, 6, 9};
        std::vector<size_t> outCounts = counts, outOffsets = {0, 3, 6, 9};
        if (r == 2) {
          outCounts[1] = 4;
          outOffsets = {0, 3, 7, 10};
        }
        c.alltoallv(in.tensor(12, DataType::kFloat32), counts, offsets,
                    out.tensor(13, DataType::kFloat32), outCounts, outOffsets);
      },
      o);
  for (int r = 0; r < kRanks; ++r) {
    std::string what;
    EXPECT_EQ(codeOf(errors[r], &what), ErrorCode::kMismatch) << r << ": " << what;
    EXPECT_NE(what.find("rank 1 sends 3 elements to rank 2, which expects 4"), std::string::npos)
        << what;
  }
}

TEST_F(NcclBackendTest, APointToPointSendNobodyReceivesEndsInATimeout) {
  setParam("GFLOW_NCCL_P2P", "1");
  std::atomic<bool> sent{false};
  auto errors = testing::runRanksCollect(
      2,
      [&](Communicator& c) {
        DeviceBuffer buf(c.rank(), 64 * 4);
        c.allreduce(buf.tensor(4, DataType::kFloat32));
        if (c.rank() == 1) {
          while (!sent.load()) std::this_thread::sleep_for(milliseconds(5));
          return;
        }
        try {
          c.send(buf.tensor(4, DataType::kFloat32), 1);
        } catch (...) {
          sent = true;
          throw;
        }
        sent = true;
      },
      within(1500));
  std::string what;
  EXPECT_EQ(codeOf(errors[0], &what), ErrorCode::kTimeout) << what;
  EXPECT_NE(what.find("(its send to rank 1 (tag 0)) did not complete"), std::string::npos) << what;
  EXPECT_FALSE(errors[1]);
}

TEST_F(NcclBackendTest, SplitUsesNcclCommSplit) {
  testing::runRanks(4, [&](Communicator& c) {
    DeviceBuffer buf(c.rank(), 8 * 4);
    c.allreduce(buf.tensor(8, DataType::kFloat32));
    auto sub = c.split(c.rank() % 2, -c.rank());  // keys reverse the order
    ASSERT_TRUE(sub);
    EXPECT_EQ(sub->rank(), c.rank() < 2 ? 1 : 0);
    for (int i = 0; i < 8; ++i) buf.as<float>()[i] = static_cast<float>(c.rank() * 10 + i);
    sub->allreduce(buf.tensor(8, DataType::kFloat32));
    const int other = c.rank() < 2 ? c.rank() + 2 : c.rank() - 2;
    for (int i = 0; i < 8; ++i) {
      ASSERT_EQ(buf.as<float>()[i], static_cast<float>((c.rank() + other) * 10 + 2 * i));
    }
    EXPECT_FALSE(c.split(-1, 0)) << "color < 0 joins no communicator";
  });
  EXPECT_EQ(softnccl::inits(), 4) << "children come from ncclCommSplit, not a new init";
  EXPECT_EQ(softnccl::splits(), 8);
}

// Rank 1 leaves a healthy world of 4 (shrink({1})); the survivors' device
// allreduce runs on NCCL, exactly. Returns after every rank ended.
void shrinkAwayRankOne() {
  auto world = testing::makeWorld(4);
  std::vector<std::shared_ptr<Communicator>> shrunk(4);  // destroyed after every rank ended
  testing::forEachRank(world, [&](Communicator& c) {
    DeviceBuffer buf(c.rank(), 8 * 4);
    c.allreduce(buf.tensor(8, DataType::kFloat32));
    shrunk[c.rank()] = c.shrink({1});
    if (c.rank() == 1) {
      EXPECT_FALSE(shrunk[1]);
      return;
    }
    ASSERT_TRUE(shrunk[c.rank()]);
    for (int i = 0; i < 8; ++i) buf.as<float>()[i] = static_cast<float>(c.rank() * 10 + i);
    shrunk[c.rank()]->allreduce(buf.tensor(8, DataType::kFloat32));
    for (int i = 0; i < 8; ++i) ASSERT_EQ(buf.as<float>()[i], static_cast<float>(50 + 3 * i));
  });
  EXPECT_EQ(softnccl::collectivesRun(), 4 + 3);
}

TEST_F(NcclBackendTest, AShrunkCommunicatorRunsOnItsPartOfTheNcclCommunicator) {
  shrinkAwayRankOne();
  EXPECT_EQ(softnccl::inits(), 4) << "no new NCCL communicator: ncclCommShrink's";
  EXPECT_EQ(softnccl::shrinks(), 3) << "the 3 survivors call ncclCommShrink";
}

TEST_F(NcclBackendTest, WithoutNcclCommShrinkAShrunkCommunicatorStartsItsOwn) {
  softnccl::setVersion(22600);  // before ncclCommShrink
  shrinkAwayRankOne();
  EXPECT_EQ(softnccl::inits(), 4 + 3) << "the 3 survivors initialize a new NCCL communicator";
  EXPECT_EQ(softnccl::shrinks(), 0);
}

// An ncclCommShrink that fails on one survivor: the others hear of it and
// stop waiting in their part of it, and the next attempt starts NCCL anew
// on every survivor.
TEST_F(NcclBackendTest, AShrinkWhoseNcclCommShrinkFailsStartsNcclAnew) {
  softnccl::failNextCall("commShrink", nccl::kInternalError);
  shrinkAwayRankOne();
  EXPECT_EQ(softnccl::shrinks(), 2) << "the two survivors whose call was accepted";
  EXPECT_EQ(softnccl::inits(), 4 + 3) << "then a new NCCL communicator";
}

// Four ranks run an allreduce on NCCL; then rank 3 stops calling, and the
// others' next allreduce fails at its deadline (or on a peer's report).
// They shrink rank 3 away and the survivors' next allreduce is exact.
void loseRankThreeInsideNccl() {
  std::vector<std::shared_ptr<Communicator>> shrunk(4);
  std::atomic<int> failed{0};
  auto world = testing::makeWorldWith(4, [](int) { return within(1500); });
  testing::forEachRank(world, [&](Communicator& c) {
    DeviceBuffer buf(c.rank(), 8 * 4);
    c.allreduce(buf.tensor(8, DataType::kFloat32));
    if (c.rank() == 3) {
      while (failed.load() < 3) std::this_thread::sleep_for(milliseconds(5));
      EXPECT_FALSE(c.shrink({3}));
      return;
    }
    EXPECT_THROW(c.allreduce(buf.tensor(8, DataType::kFloat32)), Error);
    ++failed;
    shrunk[c.rank()] = c.shrink({3});
    ASSERT_TRUE(shrunk[c.rank()]);
    for (int i = 0; i < 8; ++i) buf.as<float>()[i] = static_cast<float>(c.rank() * 10 + i);
    shrunk[c.rank()]->allreduce(buf.tensor(8, DataType::kFloat32));
    for (int i = 0; i < 8; ++i) ASSERT_EQ(buf.as<float>()[i], static_cast<float>(30 + 3 * i));
  });
  EXPECT_EQ(softnccl::collectivesRun(), 4 + 3) << "the failed allreduce wrote nothing";
}

TEST_F(NcclBackendTest, AfterAFailureTheSurvivorsShrinkTheRevokedNcclCommunicator) {
  setParam("GFLOW_NCCL_VERIFY", "0");  // the wait is inside NCCL, not in the check
  loseRankThreeInsideNccl();
  EXPECT_GE(softnccl::revokes(), 3) << "a failure revokes NCCL instead of aborting it";
  EXPECT_EQ(softnccl::shrinks(), 3);
  EXPECT_EQ(softnccl::inits(), 4);
}

TEST_F(NcclBackendTest, WithoutNcclCommRevokeAFailureAbortsAndTheSurvivorsStartAnew) {
  setParam("GFLOW_NCCL_VERIFY", "0");
  softnccl::setVersion(22700);  // ncclCommShrink, but no ncclCommRevoke
  loseRankThreeInsideNccl();
  EXPECT_EQ(softnccl::revokes(), 0);
  EXPECT_EQ(softnccl::shrinks(), 0) << "an aborted communicator cannot be shrunk";
  EXPECT_EQ(softnccl::inits(), 4 + 3);
}

TEST_F(NcclBackendTest, HierarchicalAllreduceRunsOnIntraAndCrossHostNcclCommunicators) {
  Options base;
  base.algorithm = "hier";
  auto world = testing::makeWorldWith(4, testing::onHosts({0, 0, 1, 1}, base));
  constexpr size_t kCount = 4096 + 2;  // a multiple of the 2 ranks per host
  testing::forEachRank(world, [&](Communicator& c) {
    ASSERT_EQ(c.numHosts(), 2);
    DeviceBuffer buf(c.rank(), kCount * 4);
    for (size_t i = 0; i < kCount; ++i)
      buf.as<float>()[i] = static_cast<float>(valueAt(c.rank(), i));
    c.allreduce(buf.tensor(kCount, DataType::kFloat32));
    for (size_t i = 0; i < kCount; ++i) {
      double want = 0;
      for (int q = 0; q < 4; ++q) want += valueAt(q, i);
      ASSERT_EQ(buf.as<float>()[i], static_cast<float>(want)) << i;
    }
  });
  EXPECT_EQ(softnccl::splits(), 8) << "an intra-host and a cross-host split per rank";
  EXPECT_EQ(softnccl::collectivesRun(), 3 * 4) << "reduce-scatter, allreduce, allgather";
}

// The hierarchical composition over NCCL's parts checks each op before its
// phases: counts that differ fail on every rank before any part runs.
TEST_F(NcclBackendTest, HierarchicalAllreduceOnNcclChecksTheOpFirst) {
  Options base = within(20000);
  base.algorithm = "hier";
  auto world = testing::makeWorldWith(4, testing::onHosts({0, 0, 1, 1}, base));
  testing::forEachRank(world, [&](Communicator& c) {
    DeviceBuffer buf(c.rank(), 64 * 4);
    c.allreduce(buf.tensor(8, DataType::kFloat32));  // NCCL starts, split by host
    try {
      c.allreduce(buf.tensor(c.rank() == 3 ? 32 : 64, DataType::kFloat32));
      ADD_FAILURE() << "rank " << c.rank() << ": counts that differ ran";
    } catch (const Error& e) {
      EXPECT_TRUE(e.code() == ErrorCode::kMismatch || e.code() == ErrorCode::kPeerLost) << e.what();
    }
  });
  EXPECT_EQ(softnccl::mismatches(), 0) << "no part may run before the check";
}

TEST_F(NcclBackendTest, HierarchicalAllreduceOnNcclTakesTailsAndLeavesAvgFlat) {
  Options base;
  base.algorithm = "hier";
  auto world = testing::makeWorldWith(4, testing::onHosts({0, 0, 1, 1}, base));
  constexpr size_t kCount = 4096 + 3;  // not a multiple of the 2 ranks per host
  testing::forEachRank(world, [&](Communicator& c) {
    DeviceBuffer buf(c.rank(), kCount * 8);
    for (size_t i = 0; i < kCount; ++i)
      buf.as<float>()[i] = static_cast<float>(valueAt(c.rank(), i));
    c.allreduce(buf.tensor(kCount, DataType::kFloat32), ReduceOp::kMin);
    for (size_t i = 0; i < kCount; ++i) {
      double want = valueAt(0, i);
      for (int q = 1; q < 4; ++q) want = std::min(want, valueAt(q, i));
      ASSERT_EQ(buf.as<float>()[i], static_cast<float>(want)) << i;
    }
    for (size_t i = 0; i < kCount; ++i) buf.as<double>()[i] = valueAt(c.rank(), i);
    c.allreduce(buf.tensor(kCount, DataType::kFloat64), ReduceOp::kAvg);
    for (size_t i = 0; i < kCount; ++i) {
      double want = 0;
      for (int q = 0; q < 4; ++q) want += valueAt(q, i);
      ASSERT_NEAR(buf.as<double>()[i], want / 4, 1e-12) << i;
    }
  });
  // min: blocks (reduce-scatter, allreduce, allgather) + the tail (local and
  // cross allreduce); avg: one flat NCCL allreduce.
  EXPECT_EQ(softnccl::collectivesRun(), (5 + 1) * 4);
}

}  // namespace
}  // namespace gflow

namespace gflow {
namespace {

TEST_F(NcclBackendTest, CommunicatorsSharingAStreamInAnotherOrderOnEachRankDoNotDeadlock) {
  // Two communicators whose ops use the same (default) stream, issued in a
  // different order on each rank: NCCL runs on each communicator's own
  // stream, so neither waits behind the other's kernel.
  setParam("GFLOW_NCCL_VERIFY", "0");
  testing::runRanks(
      2,
      [&](Communicator& c) {
        const int r = c.rank();
        auto sub = c.split(0, r);
        DeviceBuffer a(r, 64 * 4), b(r, 64 * 4);
        c.allreduce(a.tensor(64, DataType::kFloat32));
        sub->allreduce(b.tensor(64, DataType::kFloat32));
        for (int round = 0; round < 10; ++round) {
          for (int i = 0; i < 64; ++i) {
            a.as<float>()[i] = static_cast<float>(r + i);
            b.as<float>()[i] = static_cast<float>(10 * r + i);
          }
          if (r == 0) {
            Work w = sub->allreduceAsync(b.tensor(64, DataType::kFloat32));
            c.allreduce(a.tensor(64, DataType::kFloat32));
            w.wait();
          } else {
            Work w = c.allreduceAsync(a.tensor(64, DataType::kFloat32));
            sub->allreduce(b.tensor(64, DataType::kFloat32));
            w.wait();
          }
          for (int i = 0; i < 64; ++i) {
            ASSERT_EQ(a.as<float>()[i], static_cast<float>(1 + 2 * i));
            ASSERT_EQ(b.as<float>()[i], static_cast<float>(10 + 2 * i));
          }
        }
      },
      within(5000));
}

TEST_F(NcclBackendTest, CudaStreamPerThreadIsRejected) {
  auto errors = testing::runRanksCollect(2, [&](Communicator& c) {
    DeviceBuffer a(c.rank(), 16 * 4);
    Tensor t = a.tensor(16, DataType::kFloat32);
    t.stream = reinterpret_cast<void*>(0x2);  // cudaStreamPerThread
    c.allreduce(t);
  });
  std::string what;
  for (int r = 0; r < 2; ++r) {
    if (codeOf(errors[r], &what) == ErrorCode::kInvalidArgument) {
      EXPECT_NE(what.find("cudaStreamPerThread"), std::string::npos) << what;
    } else {
      EXPECT_EQ(codeOf(errors[r]), ErrorCode::kPeerLost) << r;
    }
  }
  EXPECT_EQ(softnccl::inits(), 0);
}

TEST_F(NcclBackendTest, AFailureWhileNcclStartsReleasesThePeersAtOnce) {
  softnccl::failNextCall("getUniqueId", nccl::kInternalError);  // rank 0 only calls it
  const auto t0 = std::chrono::steady_clock::now();
  auto errors = testing::runRanksCollect(
      3,
      [&](Communicator& c) {
        DeviceBuffer a(c.rank(), 16 * 4);
        c.allreduce(a.tensor(16, DataType::kFloat32));
      },
      within(30000));
  EXPECT_LT(std::chrono::steady_clock::now() - t0, std::chrono::seconds(10))
      << "the peers must not wait for their deadline";
  std::string what;
  EXPECT_EQ(codeOf(errors[0], &what), ErrorCode::kInternal) << what;
  EXPECT_NE(what.find("ncclGetUniqueId failed"), std::string::npos) << what;
  for (int r = 1; r < 3; ++r) {
    EXPECT_EQ(codeOf(errors[r], &what), ErrorCode::kPeerLost) << what;
    EXPECT_NE(what.find("rank 0 failed"), std::string::npos) << what;
  }
}

TEST_F(NcclBackendTest, PeersWaitingInsideNcclHearOfAFailureThroughTheStore) {
  // As with real NCCL across processes: the failing rank's abort does not
  // end the others' kernels; its report in the store does.
  softnccl::setAbortReleasesPeers(false);
  setParam("GFLOW_NCCL_VERIFY", "0");
  const auto t0 = std::chrono::steady_clock::now();
  auto errors = testing::runRanksCollect(
      3,
      [&](Communicator& c) {
        DeviceBuffer buf(c.rank(), 16 * 4);
        c.allreduce(buf.tensor(16, DataType::kFloat32));
        if (c.rank() == 1) {
          injectOnDevice(1, nccl::kSystemError);
        }
        c.allreduce(buf.tensor(16, DataType::kFloat32));
      },
      within(30000));
  EXPECT_LT(std::chrono::steady_clock::now() - t0, std::chrono::seconds(10));
  std::string what;
  EXPECT_EQ(codeOf(errors[1], &what), ErrorCode::kPeerLost) << what;
  for (int r : {0, 2}) {
    EXPECT_EQ(codeOf(errors[r], &what), ErrorCode::kPeerLost) << what;
    EXPECT_NE(what.find("rank 1 failed"), std::string::npos) << what;
  }
}

// Options::device.backend wins over GFLOW_DEVICE_BACKEND, both ways.
TEST_F(NcclBackendTest, DeviceBackendFromOptionsWinsOverTheEnvironment) {
  setParam("GFLOW_DEVICE_BACKEND", "staged");
  Options nccl;
  nccl.device.backend = "nccl";
  auto errors = testing::runRanksCollect(
      2,
      [&](Communicator& c) {
        DeviceBuffer buf(0, 16 * 4);
        c.allreduce(buf.tensor(16, DataType::kFloat32));
      },
      nccl);
  for (int r = 0; r < 2; ++r) {
    std::string what;
    EXPECT_EQ(codeOf(errors[r], &what), ErrorCode::kInvalidArgument) << "rank " << r;
    EXPECT_NE(what.find("use the same GPU"), std::string::npos) << what;
  }
  setParam("GFLOW_DEVICE_BACKEND", "nccl");
  Options staged;
  staged.device.backend = "staged";
  testing::runRanks(
      2,
      [&](Communicator& c) {
        DeviceBuffer buf(0, 16 * 4);
        for (int i = 0; i < 16; ++i) buf.as<float>()[i] = 1.0f;
        c.allreduce(buf.tensor(16, DataType::kFloat32));
        EXPECT_EQ(buf.as<float>()[15], 2.0f);
        EXPECT_EQ(c.stats().stagedOps, 1u);
      },
      staged);
  EXPECT_EQ(softnccl::inits(), 0);
}

// Options::device.verifyOps wins over GFLOW_NCCL_VERIFY: the check is an
// exchange over the host transport before each NCCL op.
TEST_F(NcclBackendTest, VerifyOpsFromOptionsWinsOverTheEnvironment) {
  setParam("GFLOW_NCCL_VERIFY", "1");
  for (bool verify : {true, false}) {
    Options o;
    o.device.verifyOps = verify;
    testing::runRanks(
        2,
        [&](Communicator& c) {
          DeviceBuffer buf(c.rank(), 16 * 4);
          c.allreduce(buf.tensor(16, DataType::kFloat32));  // NCCL starts
          // Received: counted by this rank's own reads (a peer may still be
          // reading this rank's check when NCCL completes the op beside it).
          const uint64_t before = c.stats().bytesReceived();
          c.allreduce(buf.tensor(16, DataType::kFloat32));
          EXPECT_EQ(c.stats().ncclOps, 2u);
          const uint64_t sent = c.stats().bytesReceived() - before;
          if (verify) {
            EXPECT_GT(sent, 0u);
          } else {
            EXPECT_EQ(sent, 0u);
          }
        },
        o);
  }
}

}  // namespace
}  // namespace gflow
