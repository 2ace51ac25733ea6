// Allreduce with AllreduceOptions on cuda tensors (the software CUDA and
// NCCL of tests/testing), ranks as threads: float16/bfloat16 compression,
// prescale/postscale with and without it, and the inf/NaN report, run as
// device kernels on the tensor's stream. Every result is checked against a
// float64 reference (exact where the data makes every step exact, within
// docs/compression.md's bound otherwise). Staged (the ranks share one GPU,
// so gflow's host algorithms reduce), the results are also the cpu path's
// bits for the same inputs; on NCCL (one soft GPU per rank) NCCL's own
// arithmetic sums the wire.
#include <gtest/gtest.h>

#include <cmath>
#include <cstring>
#include <limits>
#include <random>
#include <string>
#include <vector>

#include "gflow/gflow.h"
#include "testing/fixed_tree.h"
#include "testing/ranks.h"
#include "testing/soft_cuda.h"
#include "testing/soft_gpus.h"
#include "testing/soft_nccl.h"

namespace gflow {
namespace {

namespace softcuda = testing::softcuda;
namespace softnccl = testing::softnccl;

constexpr int kRanks = 3;
constexpr size_t kCount = 4099;

enum class Where { kCpu, kStaged, kNccl };
const char* toString(Where w) {
  return w == Where::kCpu ? "cpu" : w == Where::kStaged ? "staged" : "nccl";
}

// Rank r's input: normal values of `magnitude`, or small integers.
std::vector<float> inputOf(int rank, float magnitude, bool integers) {
  std::vector<float> v(kCount);
  if (integers) {
    for (size_t i = 0; i < kCount; ++i) {
      v[i] = static_cast<float>(static_cast<int>((rank * 5 + i * 7) % 13) - 6);
    }
    return v;
  }
  std::mt19937 rng(static_cast<uint32_t>(77 + rank));
  std::normal_distribution<float> d(0.0f, magnitude);
  for (float& x : v) x = d(rng);
  return v;
}

AllreduceOptions options(ReduceOp op, DataType wire, float prescale = 1.0f,
                         float postscale = 1.0f) {
  AllreduceOptions o;
  o.op = op;
  o.wire = wire;
  o.prescale = prescale;
  o.postscale = postscale;
  return o;
}

struct Outcome {
  std::vector<std::vector<float>> values;  // per rank
  std::vector<char> nonFinite;             // per rank (not vector<bool>: ranks write it at once)
};

// allreduce(inout, o) of inputs[r] on every rank, on `where`; the async
// form with `async`.
Outcome run(Where where, const AllreduceOptions& o, const std::vector<std::vector<float>>& inputs,
            bool async = false) {
  Outcome out;
  out.values.resize(kRanks);
  out.nonFinite.resize(kRanks);
  testing::runRanks(kRanks, [&](Communicator& comm) {
    const int r = comm.rank();
    std::vector<float> host = inputs[r];
    Tensor t = tensor(host.data(), host.size());
    void* mem = nullptr;
    if (where != Where::kCpu) {
      const int gpu = where == Where::kStaged ? 0 : r;
      mem = softcuda::alloc(gpu, host.size() * sizeof(float));
      std::memcpy(mem, host.data(), host.size() * sizeof(float));
      t = Tensor(mem, host.size(), DataType::kFloat32, Device{DeviceType::kCUDA, gpu});
    }
    if (async) {
      Work w = comm.allreduceAsync(t, o);
      w.wait();
      out.nonFinite[r] = w.nonFinite();
    } else {
      out.nonFinite[r] = comm.allreduce(t, o).nonFinite;
    }
    const auto* p = static_cast<const float*>(t.data);
    out.values[r].assign(p, p + t.count);
    softcuda::free(mem);
  });
  return out;
}

// The float64 reference of element i: op over the ranks' inputs, with the
// scales.
double reference(const std::vector<std::vector<float>>& in, size_t i, const AllreduceOptions& o) {
  double s = 0;
  for (const auto& v : in) s += static_cast<double>(v[i]) * o.prescale;
  if (o.op == ReduceOp::kAvg) s /= kRanks;
  return s * o.postscale;
}

// docs/compression.md's bound for element i: the roundings of the N
// inputs, the N - 1 hops and the scales, relative to the magnitude (in the
// wire type, or float32 uncompressed), plus their underflow near zero.
double bound(const std::vector<std::vector<float>>& in, size_t i, const AllreduceOptions& o) {
  const double u = o.wire == DataType::kFloat16    ? std::ldexp(1.0, -11)
                   : o.wire == DataType::kBFloat16 ? std::ldexp(1.0, -8)
                                                   : std::ldexp(1.0, -24);
  const double eta = o.wire == DataType::kFloat16 ? std::ldexp(1.0, -25) : std::ldexp(1.0, -134);
  double mag = 0;
  for (const auto& v : in) mag += std::fabs(static_cast<double>(v[i]) * o.prescale);
  if (o.op == ReduceOp::kAvg) mag /= kRanks;
  return ((kRanks + 2) * u * mag + (kRanks + 1) * eta) * std::fabs(o.postscale);
}

void expectWithinBound(const Outcome& got, const std::vector<std::vector<float>>& in,
                       const AllreduceOptions& o, const std::string& what) {
  for (int r = 0; r < kRanks; ++r) {
    EXPECT_FALSE(got.nonFinite[r]) << what;
    for (size_t i = 0; i < kCount; ++i) {
      const double want = reference(in, i, o);
      ASSERT_LE(std::fabs(got.values[r][i] - want), bound(in, i, o))
          << what << " rank " << r << " element " << i << " want " << want;
    }
  }
}

void expectSameBits(const Outcome& a, const Outcome& b, const std::string& what) {
  for (int r = 0; r < kRanks; ++r) {
    ASSERT_EQ(a.values[r].size(), b.values[r].size()) << what;
    ASSERT_EQ(std::memcmp(a.values[r].data(), b.values[r].data(), kCount * sizeof(float)), 0)
        << what << " rank " << r;
    EXPECT_EQ(a.nonFinite[r], b.nonFinite[r]) << what << " rank " << r;
  }
}

// Ends checking that the communicators' pooled kernels freed their memory.
class DeviceAllreduceOptions : public testing::OnSoftGpus<kRanks> {
 protected:
  // Runs `o` on the cpu, staged and on NCCL: each within the bound of the
  // reference, staged the cpu's bits, and the device paths as kernels
  // (staged without NCCL, nccl through it).
  void checkEverywhere(const AllreduceOptions& o, const std::vector<std::vector<float>>& in,
                       const std::string& what) {
    const Outcome cpu = run(Where::kCpu, o, in);
    expectWithinBound(cpu, in, o, what + " cpu");
    for (Where w : {Where::kStaged, Where::kNccl}) {
      const uint64_t launches = softcuda::kernelLaunches();
      const int inits = softnccl::inits();
      const Outcome dev = run(w, o, in, w == Where::kNccl);
      const std::string on = what + " " + toString(w);
      expectWithinBound(dev, in, o, on);
      if (w == Where::kStaged) {
        expectSameBits(dev, cpu, on);
        EXPECT_EQ(softnccl::inits(), inits) << on << ": ranks sharing a GPU are staged";
      } else {
        EXPECT_GT(softnccl::inits(), inits) << on << " must run on NCCL";
      }
      // Every rank ran at least the inf/NaN scan as a kernel.
      EXPECT_GE(softcuda::kernelLaunches(), launches + kRanks) << on;
    }
  }
};

std::vector<std::vector<float>> inputs(float magnitude, bool integers = false) {
  std::vector<std::vector<float>> in;
  for (int r = 0; r < kRanks; ++r) in.push_back(inputOf(r, magnitude, integers));
  return in;
}

TEST_F(DeviceAllreduceOptions, CompressedSumAndAvgMatchTheReferenceAndTheCpuBits) {
  const auto in = inputs(3.0f);
  for (DataType wire : {DataType::kFloat16, DataType::kBFloat16}) {
    for (ReduceOp op : {ReduceOp::kSum, ReduceOp::kAvg}) {
      checkEverywhere(options(op, wire), in,
                      std::string(gflow::toString(wire)) + " " + gflow::toString(op));
    }
  }
}

TEST_F(DeviceAllreduceOptions, PrescaleAndPostscaleWithAndWithoutCompression) {
  const auto in = inputs(3.0f);
  for (DataType wire : {DataType::kFloat32, DataType::kFloat16, DataType::kBFloat16}) {
    checkEverywhere(options(ReduceOp::kSum, wire, 0.3f, 1.7f), in,
                    std::string("scaled ") + gflow::toString(wire));
  }
}

TEST_F(DeviceAllreduceOptions, ScalesOfExactDataGiveTheExactResultOnEveryPath) {
  // Small integers, a power-of-two prescale and a sum: every step is exact,
  // so every path (NCCL's order of summing included) gives the reference.
  const auto in = inputs(0.0f, true);
  for (DataType wire : {DataType::kFloat32, DataType::kFloat16, DataType::kBFloat16}) {
    const AllreduceOptions o = options(ReduceOp::kSum, wire, 0.25f, 3.0f);
    for (Where w : {Where::kCpu, Where::kStaged, Where::kNccl}) {
      const Outcome got = run(w, o, in);
      for (int r = 0; r < kRanks; ++r) {
        for (size_t i = 0; i < kCount; ++i) {
          ASSERT_EQ(got.values[r][i], static_cast<float>(reference(in, i, o)))
              << gflow::toString(wire) << " " << toString(w) << " rank " << r << " element " << i;
        }
      }
    }
  }
}

TEST_F(DeviceAllreduceOptions, AnInfOnOneRankIsReportedOnEveryRank) {
  for (DataType wire : {DataType::kFloat32, DataType::kFloat16}) {
    for (Where w : {Where::kCpu, Where::kStaged, Where::kNccl}) {
      auto in = inputs(1.0f);
      const AllreduceOptions o = options(ReduceOp::kSum, wire, 1.0f, 0.5f);
      const std::string what = std::string(gflow::toString(wire)) + " " + toString(w);
      const Outcome clean = run(w, o, in);
      for (int r = 0; r < kRanks; ++r) EXPECT_FALSE(clean.nonFinite[r]) << what;
      in[1][17] = std::numeric_limits<float>::infinity();
      const Outcome inf = run(w, o, in, true);
      for (int r = 0; r < kRanks; ++r) {
        EXPECT_TRUE(inf.nonFinite[r]) << what << " rank " << r;
        EXPECT_TRUE(std::isinf(inf.values[r][17])) << what << " rank " << r;
        EXPECT_TRUE(std::isfinite(inf.values[r][18])) << what << " rank " << r;
      }
    }
  }
  // A float16 sum beyond the wire's range overflows to inf: reported too.
  std::vector<std::vector<float>> big(kRanks, std::vector<float>(kCount, 30000.0f));
  const Outcome over = run(Where::kStaged, options(ReduceOp::kSum, DataType::kFloat16), big);
  for (int r = 0; r < kRanks; ++r) EXPECT_TRUE(over.nonFinite[r]) << "rank " << r;
}

// Reproducible mode on cuda tensors: NCCL cannot reduce in the fixed order, so
// even where it would run (one soft GPU per rank) the op is staged through
// the host's fixed order; cpu, staged and the "nccl" placement give the
// fixed-order reference's bits, compressed or not, and NCCL never starts.
TEST_F(DeviceAllreduceOptions, ReproducibleGivesTheFixedOrderBitsOnEveryPlacement) {
  const auto in = inputs(3.0f);
  for (DataType wire : {DataType::kFloat32, DataType::kFloat16}) {
    AllreduceOptions o = options(ReduceOp::kSum, wire);
    o.reproducible = true;
    const Outcome cpu = run(Where::kCpu, o, in);
    if (wire == DataType::kFloat32) {
      std::vector<float> x(kRanks);
      for (size_t i = 0; i < kCount; ++i) {
        for (int r = 0; r < kRanks; ++r) x[r] = in[r][i];
        const float want = testing::fixedTreeSum(x);
        ASSERT_EQ(std::memcmp(&cpu.values[0][i], &want, sizeof want), 0) << "element " << i;
      }
    }
    const int inits = softnccl::inits();
    for (Where w : {Where::kStaged, Where::kNccl}) {
      expectSameBits(run(w, o, in), cpu,
                     std::string("reproducible ") + toString(w) + " " + gflow::toString(wire));
    }
    EXPECT_EQ(softnccl::inits(), inits) << "a reproducible op started NCCL";
  }
}

// A quantized wire with error feedback on cuda tensors: the quantize and
// dequantize kernels (the CPU twin in the software CUDA) on the tensor's
// stream, the residual in device memory. Staged, the cpu path's bits for
// the result and the residual; "nccl" (one GPU per rank: NCCL has no
// quantized type, so the op is staged through the host) as well.
TEST_F(DeviceAllreduceOptions, QuantizedWireWithFeedbackIsTheCpuPathsBits) {
  const auto in = inputs(2.0f);
  for (DataType wire : {DataType::kQInt8, DataType::kQInt4}) {
    std::vector<std::vector<std::vector<float>>> got(3);  // [where][rank]: values then residual
    for (Where w : {Where::kCpu, Where::kStaged, Where::kNccl}) {
      auto& out = got[static_cast<int>(w)];
      out.resize(kRanks);
      testing::runRanks(kRanks, [&](Communicator& comm) {
        const int r = comm.rank();
        std::vector<float> host = in[r], residual(kCount, 0.01f * float(r));
        Tensor t = tensor(host.data(), kCount), res = tensor(residual.data(), kCount);
        std::vector<void*> mem;
        if (w != Where::kCpu) {
          const int gpu = w == Where::kStaged ? 0 : r;
          for (Tensor* x : {&t, &res}) {
            mem.push_back(softcuda::alloc(gpu, kCount * sizeof(float)));
            std::memcpy(mem.back(), x->data, kCount * sizeof(float));
            *x = Tensor(mem.back(), kCount, DataType::kFloat32, Device{DeviceType::kCUDA, gpu});
          }
        }
        AllreduceOptions o = options(ReduceOp::kAvg, wire);
        o.residual = res;
        EXPECT_FALSE(comm.allreduce(t, o).nonFinite);
        const auto* v = static_cast<const float*>(t.data);
        const auto* q = static_cast<const float*>(res.data);
        out[r].assign(v, v + kCount);
        out[r].insert(out[r].end(), q, q + kCount);
        for (void* m : mem) softcuda::free(m);
      });
    }
    for (int r = 0; r < kRanks; ++r) {
      const auto& cpu = got[0][r];
      for (int w = 1; w < 3; ++w) {
        ASSERT_EQ(std::memcmp(got[w][r].data(), cpu.data(), cpu.size() * sizeof(float)), 0)
            << gflow::toString(wire) << " " << toString(static_cast<Where>(w)) << " rank " << r;
      }
      for (size_t i = 0; i < kCount; ++i) {  // the residual holds what this rank's block lost
        ASSERT_LE(std::fabs(cpu[kCount + i]), 2.0 * 8 / (wire == DataType::kQInt8 ? 127 : 7)) << i;
      }
    }
  }
}

TEST_F(DeviceAllreduceOptions, WorksOnTheCallersOwnStream) {
  // Each rank on its own GPU and a stream it made: the kernels run there.
  const auto in = inputs(2.0f);
  std::vector<void*> streams(kRanks);
  const AllreduceOptions o = options(ReduceOp::kSum, DataType::kBFloat16, 0.5f);
  std::vector<std::vector<float>> got(kRanks);
  testing::runRanks(kRanks, [&](Communicator& comm) {
    const int r = comm.rank();
    const cuda::Plugin& p = *softcuda::plugin();
    ASSERT_EQ(p.setDevice(r), 0);
    ASSERT_EQ(p.streamCreate(&streams[r]), 0);
    void* mem = softcuda::alloc(r, kCount * sizeof(float));
    std::memcpy(mem, in[r].data(), kCount * sizeof(float));
    Tensor t(mem, kCount, DataType::kFloat32, Device{DeviceType::kCUDA, r}, streams[r]);
    for (int round = 0; round < 2; ++round) {  // the second reuses the kernels
      std::memcpy(mem, in[r].data(), kCount * sizeof(float));
      EXPECT_FALSE(comm.allreduce(t, o).nonFinite);
    }
    const auto* v = static_cast<const float*>(mem);
    got[r].assign(v, v + kCount);
    softcuda::free(mem);
  });
  // The communicators (and their kernels of these streams) are gone.
  for (void* s : streams) EXPECT_EQ(softcuda::plugin()->streamDestroy(s), 0);
  for (int r = 0; r < kRanks; ++r) {
    for (size_t i = 0; i < kCount; ++i) {
      ASSERT_LE(std::fabs(got[r][i] - reference(in, i, o)), bound(in, i, o)) << r << "/" << i;
    }
  }
}

TEST_F(DeviceAllreduceOptions, AStreamDestroyedBeforeTheCommunicatorIsNeverUsedAgain) {
  // A caller may destroy its stream once its ops are done: the kernels
  // gflow keeps for that stream until the communicator goes must not name
  // it again (real CUDA crashed in cudaStreamSynchronize of the dead
  // stream when the communicator was destroyed). Staged and on NCCL.
  const auto in = inputs(2.0f);
  const AllreduceOptions o = options(ReduceOp::kSum, DataType::kFloat16, 0.5f);
  for (bool shared : {true, false}) {
    testing::runRanks(kRanks, [&](Communicator& comm) {
      const int r = comm.rank(), gpu = shared ? 0 : r;
      const cuda::Plugin& p = *softcuda::plugin();
      ASSERT_EQ(p.setDevice(gpu), 0);
      void* stream = nullptr;
      ASSERT_EQ(p.streamCreate(&stream), 0);
      void* mem = softcuda::alloc(gpu, kCount * sizeof(float));
      std::memcpy(mem, in[r].data(), kCount * sizeof(float));
      Tensor t(mem, kCount, DataType::kFloat32, Device{DeviceType::kCUDA, gpu}, stream);
      comm.allreduceAsync(t, o).wait();
      ASSERT_EQ(p.streamDestroy(stream), 0);  // the op is done with it
      const auto* v = static_cast<const float*>(mem);
      for (size_t i = 0; i < kCount; ++i) {
        ASSERT_LE(std::fabs(v[i] - reference(in, i, o)), bound(in, i, o)) << r << "/" << i;
      }
      softcuda::free(mem);
    });  // the communicators go here, with their kernels of the dead streams
    EXPECT_EQ(softcuda::staleHandleUses(), 0u) << (shared ? "staged" : "nccl");
  }
}

// What one rank's call raised.
struct Raised {
  bool failed = false;
  ErrorCode code = ErrorCode::kInternal;
  ErrorContext context;
  std::string what;
};

// Each rank (on its own soft GPU) runs `first` (the ranks choose NCCL, the
// kernels are made), then the next call of the soft CUDA's `entry` fails
// (`code`) and every rank runs `second`; returns what each rank raised.
std::vector<Raised> failInSecondOp(const char* entry, int code, const AllreduceOptions& first,
                                   const AllreduceOptions& second) {
  std::vector<Raised> out(kRanks);
  Options base;
  base.timeout = std::chrono::seconds(60);
  testing::runRanksCollect(
      kRanks,
      [&](Communicator& comm) {
        const int r = comm.rank();
        void* mem = softcuda::alloc(r, kCount * sizeof(float));
        Tensor t(mem, kCount, DataType::kFloat32, Device{DeviceType::kCUDA, r});
        try {
          comm.allreduce(t, first);
          comm.barrier();
          if (r == 0) softcuda::failNextCall(entry, code);
          comm.barrier();
          comm.allreduce(t, second);
        } catch (const Error& e) {
          out[r] = Raised{true, e.code(), e.context(), e.what()};
        }
        softcuda::free(mem);
      },
      base);
  return out;
}

TEST_F(DeviceAllreduceOptions, AFailedKernelFailsTheOpOnEveryRank) {
  // One rank's narrowing launch fails: its op fails with the CUDA error, and
  // its peers, inside NCCL, hear of it instead of waiting.
  const AllreduceOptions f16 = options(ReduceOp::kSum, DataType::kFloat16);
  const auto raised = failInSecondOp("narrow", softcuda::kInvalidValue, f16, f16);
  int named = 0;
  for (int r = 0; r < kRanks; ++r) {
    EXPECT_TRUE(raised[r].failed) << "rank " << r << " did not fail";
    named += raised[r].what.find("narrowing kernel") != std::string::npos;
  }
  EXPECT_GE(named, 1);
}

TEST_F(DeviceAllreduceOptions, AFailedWireAllocationFailsEveryRankNamingTheOp) {
  // After an uncompressed first op, one rank cannot allocate its wire
  // buffer: its call raises the CUDA error as the op's, on this rank, and
  // fails the communicator, so the peers hear of it instead of waiting.
  const auto raised = failInSecondOp("deviceAlloc", softcuda::kMemoryAllocation, AllreduceOptions{},
                                     options(ReduceOp::kSum, DataType::kBFloat16));
  int own = 0;
  for (int r = 0; r < kRanks; ++r) {
    const Raised& e = raised[r];
    EXPECT_TRUE(e.failed) << "rank " << r << " did not fail";
    // Every rank's error names the cause (the peers': the failed rank's report).
    EXPECT_NE(e.what.find("allocating gradient scratch memory"), std::string::npos) << e.what;
    if (e.code == ErrorCode::kInternal) {
      ++own;
      EXPECT_EQ(e.context.op, "allreduce") << e.what;
      EXPECT_EQ(e.context.rank, r) << e.what;
    }
  }
  EXPECT_EQ(own, 1);
}

}  // namespace
}  // namespace gflow
