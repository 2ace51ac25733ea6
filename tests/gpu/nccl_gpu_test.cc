// The NCCL backend and the reducer's CUDA kernels on a real GPU: every
// collective on NCCL (one rank per GPU; a single-GPU machine runs one rank),
// and the GradientReducer (fusion, float16/bfloat16 compression, CSC) on
// device tensors against the same reducer on cpu tensors, bit for bit
// (integer-valued data: every sum is exact), both staged (ranks sharing GPU
// 0) and on NCCL. Skipped without a usable GPU.
#include <cuda_runtime.h>
#include <gtest/gtest.h>

#include <cstdlib>
#include <string>
#include <vector>

#include "common/params.h"
#include "gflow/gflow.h"
#include "gflow/reducer.h"
#include "testing/ranks.h"

namespace gflow {
namespace {

struct PluginEnv {
  PluginEnv() { setenv("GFLOW_CUDA_PLUGIN", GFLOW_TEST_CUDA_PLUGIN, 0); }
} pluginEnv;

int gpus() {
  int n = 0;
  return cudaGetDeviceCount(&n) == cudaSuccess ? n : 0;
}

// Sets GFLOW_DEVICE_BACKEND for one test.
struct DeviceBackend {
  explicit DeviceBackend(const char* v) {
    setenv("GFLOW_DEVICE_BACKEND", v, 1);
    params::resetCacheForTesting();
  }
  ~DeviceBackend() {
    unsetenv("GFLOW_DEVICE_BACKEND");
    params::resetCacheForTesting();
  }
};

float valueAt(int r, size_t i) {
  return static_cast<float>(static_cast<int>((r * 5 + i * 7) % 13) - 6);
}

std::vector<float> download(const float* d, size_t n) {
  std::vector<float> h(n);
  EXPECT_EQ(cudaMemcpy(h.data(), d, n * 4, cudaMemcpyDeviceToHost), cudaSuccess);
  return h;
}

TEST(GpuNccl, EveryCollectiveRunsOnNcclOneRankPerGpu) {
  const int n = gpus();
  if (n == 0) GTEST_SKIP() << "no usable GPU";
  DeviceBackend nccl("nccl");  // an error, not staging, if NCCL cannot run
  testing::runRanks(n, [&](Communicator& c) {
    const int r = c.rank();
    ASSERT_EQ(cudaSetDevice(r), cudaSuccess);
    cudaStream_t s;
    ASSERT_EQ(cudaStreamCreate(&s), cudaSuccess);
    const size_t count = (size_t(1) << 20) + 3;
    const Device gpu{DeviceType::kCUDA, r};
    std::vector<float> h(count * n);
    for (size_t i = 0; i < h.size(); ++i) h[i] = valueAt(r, i);
    float *a = nullptr, *b = nullptr;
    ASSERT_EQ(cudaMalloc(&a, h.size() * 4), cudaSuccess);
    ASSERT_EQ(cudaMalloc(&b, h.size() * 4), cudaSuccess);
    // Enqueued on the stream before the call: gflow must wait for it.
    ASSERT_EQ(cudaMemcpyAsync(a, h.data(), count * 4, cudaMemcpyHostToDevice, s), cudaSuccess);
    c.allreduce(Tensor(a, count, DataType::kFloat32, gpu, s));
    auto got = download(a, count);
    for (size_t i = 0; i < count; ++i) {
      float want = 0;
      for (int q = 0; q < n; ++q) want += valueAt(q, i);
      ASSERT_EQ(got[i], want) << i;
    }
    ASSERT_EQ(cudaMemcpy(a, h.data(), h.size() * 4, cudaMemcpyHostToDevice), cudaSuccess);
    c.reduceScatter(Tensor(a, count * n, DataType::kFloat32, gpu, s),
                    Tensor(b, count, DataType::kFloat32, gpu, s));
    got = download(b, count);
    for (size_t i = 0; i < count; ++i) {
      float want = 0;
      for (int q = 0; q < n; ++q) want += valueAt(q, r * count + i);
      ASSERT_EQ(got[i], want) << i;
    }
    c.allgather(Tensor(b, count, DataType::kFloat32, gpu, s),
                Tensor(a, count * n, DataType::kFloat32, gpu, s));
    got = download(a, count * n);
    for (int q = 0; q < n; ++q) {
      for (size_t i = 0; i < count; i += 997) {
        float want = 0;
        for (int p = 0; p < n; ++p) want += valueAt(p, q * count + i);
        ASSERT_EQ(got[q * count + i], want);
      }
    }
    ASSERT_EQ(cudaMemcpy(a, h.data(), count * 4, cudaMemcpyHostToDevice), cudaSuccess);
    c.broadcast(Tensor(a, count, DataType::kFloat32, gpu, s), n - 1);
    got = download(a, count);
    for (size_t i = 0; i < count; i += 997) ASSERT_EQ(got[i], valueAt(n - 1, i));
    cudaFree(a);
    cudaFree(b);
    cudaStreamDestroy(s);
  });
}

struct Case {
  const char* name;
  DataType wire;
  double density;
  float momentum;
};
const std::vector<size_t> kSizes = {5, 130, 7, 300000, 64, 1, 4099};

// Each rank's gradients after every step; gpuOf(rank) < 0: cpu tensors.
std::vector<std::vector<float>> runReducer(int ranks, const Case& k, int (*gpuOf)(int)) {
  std::vector<std::vector<float>> out(ranks);
  testing::runRanks(ranks, [&](Communicator& comm) {
    const int r = comm.rank(), gpu = gpuOf(r);
    if (gpu >= 0) cudaSetDevice(gpu);
    std::vector<std::vector<float>> host(kSizes.size());
    std::vector<float*> dev(kSizes.size(), nullptr);
    std::vector<Tensor> grads;
    for (size_t t = 0; t < kSizes.size(); ++t) {
      host[t].resize(kSizes[t]);
      if (gpu >= 0) {
        cudaMalloc(&dev[t], kSizes[t] * 4);
        grads.emplace_back(dev[t], kSizes[t], DataType::kFloat32, Device{DeviceType::kCUDA, gpu});
      } else {
        grads.push_back(tensor(host[t].data(), kSizes[t]));
      }
    }
    ReducerOptions o;
    o.op = ReduceOp::kSum;
    o.fusionThreshold = 64 * 1024;
    o.wire = k.wire;
    o.sparse.density = k.density;
    o.sparse.chunk = 256;
    o.sparse.momentum = k.momentum;
    GradientReducer reducer(comm.split(0, r), grads, o);
    for (int step = 0; step < 3; ++step) {
      for (size_t t = 0; t < kSizes.size(); ++t) {
        for (size_t i = 0; i < kSizes[t]; ++i) host[t][i] = valueAt(r + int(t), i + step * 3);
        if (gpu >= 0) cudaMemcpy(dev[t], host[t].data(), kSizes[t] * 4, cudaMemcpyHostToDevice);
      }
      for (size_t t = kSizes.size(); t-- > 0;) reducer.ready(t);
      reducer.wait();
      for (size_t t = 0; t < kSizes.size(); ++t) {
        const std::vector<float> v = gpu >= 0 ? download(dev[t], kSizes[t]) : host[t];
        out[r].insert(out[r].end(), v.begin(), v.end());
      }
    }
    for (float* d : dev) cudaFree(d);
  });
  return out;
}

class GpuReducer : public ::testing::TestWithParam<Case> {};

TEST_P(GpuReducer, MatchesTheCpuReducerStagedAndOnNccl) {
  if (gpus() == 0) GTEST_SKIP() << "no usable GPU";
  const Case& k = GetParam();
  // Three ranks sharing GPU 0: staged through host memory.
  const auto cpu3 = runReducer(3, k, [](int) { return -1; });
  const auto staged = runReducer(3, k, [](int) { return 0; });
  EXPECT_EQ(staged, cpu3);
  // One rank per GPU: NCCL.
  DeviceBackend nccl("nccl");
  const int n = gpus();
  const auto cpuN = runReducer(n, k, [](int) { return -1; });
  const auto onNccl = runReducer(n, k, [](int r) { return r; });
  EXPECT_EQ(onNccl, cpuN);
}

INSTANTIATE_TEST_SUITE_P(Kernels, GpuReducer,
                         ::testing::Values(Case{"dense", DataType::kFloat32, 0, 0},
                                           Case{"float16", DataType::kFloat16, 0, 0},
                                           Case{"bfloat16", DataType::kBFloat16, 0, 0},
                                           Case{"qint8", DataType::kQInt8, 0, 0},
                                           Case{"qint4", DataType::kQInt4, 0, 0},
                                           Case{"csc", DataType::kFloat32, 0.25, 0},
                                           Case{"csc_momentum", DataType::kFloat32, 0.5, 0.5f}),
                         [](const ::testing::TestParamInfo<Case>& i) {
                           return std::string(i.param.name);
                         });

}  // namespace
}  // namespace gflow
