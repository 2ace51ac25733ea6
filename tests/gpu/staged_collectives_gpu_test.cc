// Device tensors through the host backends (docs/backends.md, "CUDA device
// tensors"): several ranks (threads) sharing one GPU, every collective
// staged through pinned host memory, against exact references. Skipped
// without a usable GPU.
#include <cuda_runtime.h>
#include <gtest/gtest.h>

#include <cstdlib>
#include <string>
#include <vector>

#include "gflow/gflow.h"
#include "testing/ranks.h"

namespace gflow {
namespace {

struct PluginEnv {
  PluginEnv() { setenv("GFLOW_CUDA_PLUGIN", GFLOW_TEST_CUDA_PLUGIN, 0); }
} pluginEnv;

std::string noGpu() {
  int n = 0;
  cudaError_t e = cudaGetDeviceCount(&n);
  if (e != cudaSuccess) return std::string("no usable GPU: ") + cudaGetErrorString(e);
  return n == 0 ? "no GPU found" : "";
}

struct Dev {
  float* p = nullptr;
  size_t n = 0;
  explicit Dev(const std::vector<float>& v) : n(v.size()) {
    cudaMalloc(&p, n * sizeof(float));
    cudaMemcpy(p, v.data(), n * sizeof(float), cudaMemcpyHostToDevice);
  }
  ~Dev() { cudaFree(p); }
  std::vector<float> get() const {
    std::vector<float> v(n);
    cudaMemcpy(v.data(), p, n * sizeof(float), cudaMemcpyDeviceToHost);
    return v;
  }
  Tensor t(void* stream = nullptr) const {
    return Tensor(p, n, DataType::kFloat32, Device{DeviceType::kCUDA, 0}, stream);
  }
};

TEST(GpuStaged, EveryCollectiveOnDeviceTensorsIsExact) {
  const std::string why = noGpu();
  if (!why.empty()) GTEST_SKIP() << why;
  for (const char* algo : {"", "ring"}) {
    Options base;
    base.algorithm = algo;
    testing::runRanks(
        3,
        [&](Communicator& c) {
          cudaSetDevice(0);
          cudaStream_t s;
          cudaStreamCreate(&s);
          const int n = c.size(), r = c.rank();
          const size_t count = 100003;
          std::vector<float> mine(count);
          for (size_t i = 0; i < count; ++i) mine[i] = float(r * 1000 + i % 997);
          Dev a(mine), out(std::vector<float>(count, -1.0f));
          // Enqueued on the stream right before the op: the op must see it.
          cudaMemsetAsync(a.p, 0, sizeof(float), s);
          c.allreduce(a.t(s), out.t(s), ReduceOp::kSum);
          std::vector<float> got = out.get();
          for (size_t i = 1; i < count; ++i) {
            ASSERT_EQ(got[i], float(1000 * (n * (n - 1) / 2) + n * (i % 997))) << i;
          }
          ASSERT_EQ(got[0], 0.0f);
          c.allreduce(a.t(s));  // in place
          ASSERT_EQ(a.get()[5], float(1000 * (n * (n - 1) / 2) + n * 5));

          Dev block(std::vector<float>(1000, float(r + 1)));
          Dev all(std::vector<float>(1000 * n, 0.0f));
          c.allgather(block.t(s), all.t(s));
          std::vector<float> ag = all.get();
          for (int q = 0; q < n; ++q) ASSERT_EQ(ag[q * 1000 + 999], float(q + 1));
          c.reduceScatter(all.t(s), block.t(s));
          ASSERT_EQ(block.get()[0], float(n * (r + 1)));

          Dev b(std::vector<float>(5000, float(r)));
          c.broadcast(b.t(s), 2);
          ASSERT_EQ(b.get()[4999], 2.0f);

          Dev x(std::vector<float>(7777, 1.0f));
          Work w = c.allreduceAsync(x.t(s));
          w.wait();
          ASSERT_EQ(x.get()[7776], float(n));
          cudaStreamDestroy(s);
        },
        base);
  }
}

}  // namespace
}  // namespace gflow
