// Device tensors through the host backends (docs/backends.md, "CUDA device
// tensors"): several ranks (threads) sharing one GPU, every collective
// staged through pinned host memory, against exact references, and
// allreduce with AllreduceOptions (compression, scales, the inf/NaN report)
// against the cpu path bit for bit. Skipped without a usable GPU.
#include <cuda_runtime.h>
#include <gtest/gtest.h>

#include <cmath>
#include <cstdlib>
#include <cstring>
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

// AllreduceOptions on device tensors: the before/after kernels on the
// caller's stream around a staged collective give the cpu path's bits.
TEST(GpuStaged, AllreduceOptionsGiveTheCpuPathsBits) {
  const std::string why = noGpu();
  if (!why.empty()) GTEST_SKIP() << why;
  const int kRanks = 3;
  const size_t count = 50001;
  auto input = [](int r, size_t i) {
    return std::sin(static_cast<float>(i * 0.37 + r)) * (r == 1 && i == 77 ? 3e38f : 3.0f);
  };
  struct Variant {
    DataType wire;
    ReduceOp op;
    float prescale, postscale;
  };
  const Variant variants[] = {{DataType::kFloat16, ReduceOp::kSum, 1.0f, 1.0f},
                              {DataType::kBFloat16, ReduceOp::kAvg, 1.0f, 1.0f},
                              {DataType::kFloat16, ReduceOp::kAvg, 0.3f, 1.7f},
                              {DataType::kFloat32, ReduceOp::kSum, 0.3f, 1.7f}};
  for (const Variant& v : variants) {
    AllreduceOptions o;
    o.op = v.op;
    o.wire = v.wire;
    o.prescale = v.prescale;
    o.postscale = v.postscale;
    std::vector<std::vector<float>> cpu(kRanks), gpu(kRanks);
    std::vector<int> cpuBad(kRanks), gpuBad(kRanks);
    testing::runRanks(kRanks, [&](Communicator& c) {
      const int r = c.rank();
      std::vector<float> mine(count);
      for (size_t i = 0; i < count; ++i) mine[i] = input(r, i);
      cpu[r] = mine;
      cpuBad[r] = c.allreduce(tensor(cpu[r].data(), count), o).nonFinite;
      cudaSetDevice(0);
      cudaStream_t s;
      cudaStreamCreate(&s);
      Dev d(mine);
      // Enqueued on the stream right before the op: the op must see it.
      cudaMemsetAsync(d.p + 5, 0, sizeof(float), s);
      Work w = c.allreduceAsync(d.t(s), o);
      w.wait();
      gpuBad[r] = w.nonFinite();
      gpu[r] = d.get();
      cudaStreamDestroy(s);
    });
    for (int r = 0; r < kRanks; ++r) {
      // 3e38 overflows float16 only.
      EXPECT_EQ(cpuBad[r] != 0, v.wire == DataType::kFloat16) << toString(v.wire);
      EXPECT_EQ(gpuBad[r], cpuBad[r]) << toString(v.wire) << " rank " << r;
      ASSERT_EQ(gpu[r][5], 0.0f) << "the op must see the work enqueued before it";
      for (size_t i = 0; i < count; ++i) {
        if (i == 5) continue;  // zeroed on the device only
        if (std::isnan(cpu[r][i])) {
          ASSERT_TRUE(std::isnan(gpu[r][i])) << i;  // a NaN's payload is the GPU's own
          continue;
        }
        ASSERT_EQ(0, std::memcmp(&gpu[r][i], &cpu[r][i], sizeof(float)))
            << toString(v.wire) << " rank " << r << " element " << i;
      }
    }
  }
}

}  // namespace
}  // namespace gflow
