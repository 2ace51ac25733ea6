// GradientReducer and allreduceCoalesced on cuda tensors (the software CUDA
// and NCCL of tests/testing): fusion, float16/bfloat16 compression and CSC
// run as device kernels, and every result must equal, bit for bit, what the
// same reducer computes on cpu tensors with the same inputs (integer-valued
// data, so every sum is exact whatever the order), which the host tests
// check against float64 references. Each case runs on NCCL (one soft GPU per
// rank) and staged (the ranks share one GPU).
#include <gtest/gtest.h>

#include <cstring>
#include <string>
#include <vector>

#include "common/params.h"
#include "gflow/gflow.h"
#include "gflow/reducer.h"
#include "testing/ranks.h"
#include "testing/soft_cuda.h"
#include "testing/soft_gpus.h"
#include "testing/soft_nccl.h"

namespace gflow {
namespace {

namespace softcuda = testing::softcuda;
namespace softnccl = testing::softnccl;

constexpr int kRanks = 3;
// Gradient sizes: small ones fuse, the big one goes in place.
const std::vector<size_t> kSizes = {5, 130, 7, 3000, 64, 1};

// Rank r's gradient element i of tensor t at step s: small integers.
float gradAt(int r, size_t t, size_t i, int s) {
  return static_cast<float>(static_cast<int>((r * 5 + t * 3 + i * 7 + s * 11) % 13) - 6);
}

struct Case {
  const char* name;
  DataType wire;
  double density;
  float momentum;
  bool flat;  // gradients as views into one buffer (reduced in place)
};

// Runs `steps` steps of a reducer over kSizes on every rank and returns
// each rank's gradients after every step (all steps concatenated).
// device: -1 cpu tensors; 0: every rank on soft GPU 0 (staged); 1: rank r on
// soft GPU r (NCCL).
std::vector<std::vector<float>> run(const Case& c, int device, int steps) {
  std::vector<std::vector<float>> out(kRanks);
  testing::runRanks(kRanks, [&](Communicator& comm) {
    const int r = comm.rank();
    const int gpu = device == 0 ? 0 : r;
    size_t total = 0;
    for (size_t n : kSizes) total += n;
    // Flat: one allocation for all; else one per tensor.
    std::vector<void*> mem;
    std::vector<std::vector<float>> host(kSizes.size());
    std::vector<Tensor> grads;
    auto alloc = [&](size_t n) -> float* {
      if (device < 0) return nullptr;
      mem.push_back(softcuda::alloc(gpu, n * sizeof(float)));
      return static_cast<float*>(mem.back());
    };
    float* flat = c.flat ? alloc(total) : nullptr;
    std::vector<float> flatHost(c.flat && device < 0 ? total : 0);
    size_t at = 0;
    for (size_t t = 0; t < kSizes.size(); ++t) {
      float* p;
      if (device < 0) {
        host[t].resize(kSizes[t]);
        p = c.flat ? flatHost.data() + at : host[t].data();
      } else {
        p = c.flat ? flat + at : alloc(kSizes[t]);
      }
      at += kSizes[t];
      grads.emplace_back(p, kSizes[t], DataType::kFloat32,
                         device < 0 ? Device{} : Device{DeviceType::kCUDA, gpu});
    }
    ReducerOptions o;
    o.op = ReduceOp::kSum;
    o.fusionThreshold = 1024;
    o.wire = c.wire;
    o.sparse.density = c.density;
    o.sparse.chunk = 16;
    o.sparse.momentum = c.momentum;
    GradientReducer reducer(comm.split(0, r), grads, o);
    for (int s = 0; s < steps; ++s) {
      for (size_t t = 0; t < kSizes.size(); ++t) {
        auto* p = static_cast<float*>(grads[t].data);
        for (size_t i = 0; i < kSizes[t]; ++i) p[i] = gradAt(r, t, i, s);
      }
      for (size_t t = kSizes.size(); t-- > 0;) reducer.ready(t);
      reducer.wait();
      for (const Tensor& g : grads) {
        const auto* p = static_cast<const float*>(g.data);
        out[r].insert(out[r].end(), p, p + g.count);
      }
    }
    for (void* m : mem) softcuda::free(m);
  });
  return out;
}

class DeviceReducer : public testing::OnSoftGpus<kRanks, ::testing::TestWithParam<Case>> {};

TEST_P(DeviceReducer, MatchesTheCpuReducerOnNcclAndStaged) {
  const Case& c = GetParam();
  const int steps = 3;
  const auto want = run(c, -1, steps);
  for (int r = 1; r < kRanks; ++r) ASSERT_EQ(want[r], want[0]) << "cpu ranks disagree";
  for (int device : {1, 0}) {
    const int initsBefore = softnccl::inits();
    const auto got = run(c, device, steps);
    for (int r = 0; r < kRanks; ++r) {
      ASSERT_EQ(got[r].size(), want[r].size());
      for (size_t i = 0; i < want[r].size(); ++i) {
        ASSERT_EQ(got[r][i], want[r][i])
            << (device == 1 ? "nccl" : "staged") << " rank " << r << " element " << i;
      }
    }
    if (device == 1) {
      EXPECT_GT(softnccl::inits(), initsBefore) << "the device reducer must run on NCCL";
    } else {
      EXPECT_EQ(softnccl::inits(), initsBefore) << "ranks sharing a GPU are staged";
    }
  }
  EXPECT_GT(softcuda::kernelLaunches(), 0u);
}

INSTANTIATE_TEST_SUITE_P(
    Kernels, DeviceReducer,
    ::testing::Values(Case{"dense", DataType::kFloat32, 0, 0, false},
                      Case{"dense_flat", DataType::kFloat32, 0, 0, true},
                      Case{"float16", DataType::kFloat16, 0, 0, false},
                      Case{"bfloat16_flat", DataType::kBFloat16, 0, 0, true},
                      Case{"qint8", DataType::kQInt8, 0, 0, false},
                      Case{"qint4_flat", DataType::kQInt4, 0, 0, true},
                      Case{"csc", DataType::kFloat32, 0.5, 0, false},
                      Case{"csc_momentum_bf16", DataType::kBFloat16, 0.25, 0.5f, false}),
    [](const ::testing::TestParamInfo<Case>& i) { return std::string(i.param.name); });

// The automatic wire's residual guard reads device residuals. Candidates
// float32 and qint4, one step per probe stage, a decision every step and a
// new probe after each: steps 0-1 probe, 2 is settled, 3-4 probe again.
// With a limit every qint4 residual passes, the decision after step 1 caps
// every bucket at float32, so step 4 (the new probe's qint4 stage) stays
// float32; without the guard it is qint4, whatever the timing.
class DeviceAutoWire : public testing::OnSoftGpus<kRanks> {};

TEST_F(DeviceAutoWire, TheResidualGuardReadsDeviceResiduals) {
  std::vector<std::vector<DataType>> wires(kRanks);
  testing::runRanks(kRanks, [&](Communicator& comm) {
    const int r = comm.rank();
    std::vector<void*> mem;
    std::vector<Tensor> grads;
    for (size_t n : kSizes) {
      mem.push_back(softcuda::alloc(r, n * sizeof(float)));
      grads.emplace_back(mem.back(), n, DataType::kFloat32, Device{DeviceType::kCUDA, r});
    }
    ReducerOptions o;
    o.fusionThreshold = 1024;
    o.autoWire.enabled = true;
    o.autoWire.candidates = {DataType::kFloat32, DataType::kQInt4};
    o.autoWire.warmupSteps = o.autoWire.period = o.autoWire.reprobe = 1;
    o.autoWire.probeSteps = 1;
    o.autoWire.residualLimit = 1e-9;
    {
      GradientReducer reducer(comm.split(0, r), grads, o);
      for (int s = 0; s < 4; ++s) {
        for (size_t t = 0; t < kSizes.size(); ++t) {
          auto* p = static_cast<float*>(grads[t].data);  // soft device memory is host memory
          for (size_t i = 0; i < kSizes[t]; ++i) p[i] = gradAt(r, t, i, s);
        }
        for (size_t t = kSizes.size(); t-- > 0;) reducer.ready(t);
        reducer.wait();
      }
      wires[r] = reducer.wires();  // step 4's
    }
    for (void* m : mem) softcuda::free(m);
  });
  for (int r = 0; r < kRanks; ++r) {
    ASSERT_FALSE(wires[r].empty());
    for (size_t b = 0; b < wires[r].size(); ++b) {
      EXPECT_EQ(wires[r][b], DataType::kFloat32) << "rank " << r << " bucket " << b;
    }
  }
}

TEST(DeviceReducerErrors, GradientsOnSeveralGpusOrMixedWithCpuAreRejected) {
  softcuda::install(2);
  softnccl::enable();
  testing::runRanksCollect(2, [&](Communicator& comm) {
    void* a = softcuda::alloc(0, 64);
    void* b = softcuda::alloc(1, 64);
    std::vector<float> h(16);
    for (int variant = 0; variant < 2; ++variant) {
      std::vector<Tensor> grads = {
          Tensor(a, 16, DataType::kFloat32, Device{DeviceType::kCUDA, 0}),
          variant == 0 ? Tensor(b, 16, DataType::kFloat32, Device{DeviceType::kCUDA, 1})
                       : tensor(h.data(), 16)};
      auto sub = comm.split(0, comm.rank());
      try {
        GradientReducer reducer(sub, grads);
        ADD_FAILURE() << "variant " << variant << " accepted";
      } catch (const Error& e) {
        if (e.code() == ErrorCode::kInvalidArgument) {
          EXPECT_NE(
              std::string(e.what()).find(variant == 0 ? "different GPUs" : "mix cpu and cuda"),
              std::string::npos)
              << e.what();
        }
      }
    }
    softcuda::free(a);
    softcuda::free(b);
  });
  softcuda::uninstall();
}

TEST(DeviceCoalesced, AllreduceOfCudaTensorsMatchesTheExactSum) {
  softcuda::install(kRanks);
  softnccl::enable();
  testing::runRanks(kRanks, [&](Communicator& comm) {
    const int r = comm.rank();
    std::vector<void*> mem;
    std::vector<Tensor> ts;
    for (size_t t = 0; t < kSizes.size(); ++t) {
      mem.push_back(softcuda::alloc(r, kSizes[t] * 4));
      auto* p = static_cast<float*>(mem.back());
      for (size_t i = 0; i < kSizes[t]; ++i) p[i] = gradAt(r, t, i, 0);
      ts.emplace_back(p, kSizes[t], DataType::kFloat32, Device{DeviceType::kCUDA, r});
    }
    allreduceCoalesced(comm, ts, ReduceOp::kSum, 512).wait();
    for (size_t t = 0; t < kSizes.size(); ++t) {
      const auto* p = static_cast<const float*>(ts[t].data);
      for (size_t i = 0; i < kSizes[t]; ++i) {
        float want = 0;
        for (int q = 0; q < kRanks; ++q) want += gradAt(q, t, i, 0);
        ASSERT_EQ(p[i], want) << t << "/" << i;
      }
    }
    for (void* m : mem) softcuda::free(m);
  });
  softcuda::uninstall();
}

}  // namespace
}  // namespace gflow
