// The CUDA kernels (src/kernels/cuda/kernels.h) against their CPU twins, on
// a GPU. Skipped, with the reason, where no GPU is usable (this project's CI
// machines: the CUDA toolkit is installed but there is no driver or device).
// tests/gpu/run_gpu_checks.sh builds and runs this binary on GPU machines.
#include <cuda_runtime.h>
#include <gtest/gtest.h>

#include <cmath>
#include <cstring>
#include <limits>
#include <random>
#include <string>
#include <vector>

#include "kernels/convert.h"
#include "kernels/cuda/kernels.h"
#include "kernels/sparse.h"

namespace gflow {
namespace {

namespace kc = kernels::cuda;

std::string noGpuReason() {
  int n = 0;
  cudaError_t e = cudaGetDeviceCount(&n);
  if (e != cudaSuccess) return std::string("no usable GPU: ") + cudaGetErrorString(e);
  if (n == 0) return "no GPU found";
  return "";
}

#define REQUIRE_GPU()                             \
  do {                                            \
    static const std::string why = noGpuReason(); \
    if (!why.empty()) GTEST_SKIP() << why;        \
  } while (0)

#define CUDA_OK(expr) ASSERT_EQ(static_cast<int>(expr), 0) << #expr

template <typename T>
struct DeviceBuffer {
  T* p = nullptr;
  size_t n = 0;
  explicit DeviceBuffer(size_t count) : n(count) {
    if (cudaMalloc(&p, (count ? count : 1) * sizeof(T)) != cudaSuccess) p = nullptr;
  }
  ~DeviceBuffer() { cudaFree(p); }
  void upload(const std::vector<T>& v) {
    cudaMemcpy(p, v.data(), v.size() * sizeof(T), cudaMemcpyHostToDevice);
  }
  std::vector<T> download() const {
    std::vector<T> v(n);
    cudaMemcpy(v.data(), p, n * sizeof(T), cudaMemcpyDeviceToHost);
    return v;
  }
};

// Equal, with any NaN matching any NaN: a GPU's arithmetic writes its
// canonical NaN where the CPU keeps an operand's payload and sign.
bool same(float a, float b) {
  return a == b || (std::isnan(a) && std::isnan(b));
}

::testing::AssertionResult sameFloats(const std::vector<float>& got,
                                      const std::vector<float>& want) {
  if (got.size() != want.size()) {
    return ::testing::AssertionFailure() << got.size() << " values, want " << want.size();
  }
  for (size_t i = 0; i < got.size(); ++i) {
    if (!same(got[i], want[i])) {
      return ::testing::AssertionFailure() << "[" << i << "] " << got[i] << ", want " << want[i];
    }
  }
  return ::testing::AssertionSuccess();
}

std::vector<float> interesting(size_t n, uint32_t seed) {
  std::mt19937 rng(seed);
  std::uniform_real_distribution<float> d(-70000.0f, 70000.0f);
  std::vector<float> v(n);
  for (size_t i = 0; i < n; ++i) v[i] = d(rng) / float(1 + (i % 1000));
  const float specials[] = {0.0f,
                            -0.0f,
                            65504.0f,
                            65520.0f,
                            1e-8f,
                            -1e-8f,
                            6.1e-5f,
                            5.96e-8f,
                            std::numeric_limits<float>::infinity(),
                            3.3895e38f,
                            1.0f + 1.0f / 2048};
  for (size_t i = 0; i < sizeof(specials) / sizeof(float) && i < n; ++i) v[i] = specials[i];
  return v;
}

TEST(GpuKernels, NarrowAndWidenMatchTheCpuTwinBitForBit) {
  REQUIRE_GPU();
  const size_t n = 100003;
  const std::vector<float> src = interesting(n, 1);
  for (DataType wire : {DataType::kFloat16, DataType::kBFloat16}) {
    for (float scale : {1.0f, 0.25f, 3.0f}) {
      std::vector<uint16_t> cpu(n);
      kernels::narrow(cpu.data(), src.data(), n, wire, scale);
      DeviceBuffer<float> dsrc(n);
      DeviceBuffer<uint16_t> dnarrow(n);
      DeviceBuffer<float> dwide(n);
      dsrc.upload(src);
      CUDA_OK(kc::narrow(dnarrow.p, dsrc.p, n, {wire, scale}, nullptr, nullptr));
      CUDA_OK(cudaDeviceSynchronize());
      const std::vector<uint16_t> gpu = dnarrow.download();
      for (size_t i = 0; i < n; ++i) {
        ASSERT_EQ(gpu[i], cpu[i]) << toString(wire) << " scale " << scale << " i " << i << " x "
                                  << src[i];
      }
      std::vector<float> cpuWide(n);
      kernels::widen(cpuWide.data(), cpu.data(), n, wire, 1.0f / scale);
      CUDA_OK(kc::widen(dwide.p, dnarrow.p, n, {wire, 1.0f / scale}, nullptr));
      CUDA_OK(cudaDeviceSynchronize());
      const std::vector<float> gpuWide = dwide.download();
      ASSERT_EQ(0, std::memcmp(gpuWide.data(), cpuWide.data(), n * sizeof(float)));
    }
  }
}

// Quantizing (with and without error feedback), the inf/NaN flag and
// dequantizing give the CPU twin's bits: blocks with inf, NaN, zeros and
// tiny values, and a short last block.
TEST(GpuKernels, QuantizeAndDequantizeMatchTheCpuTwinBitForBit) {
  REQUIRE_GPU();
  const size_t n = 100003;
  std::vector<float> src = interesting(n, 3);
  for (size_t i = 128; i < 256; ++i) src[i] = 0.0f;    // a zero block
  for (size_t i = 256; i < 384; ++i) src[i] = 1e-38f;  // below 2^-120
  src[400] = std::numeric_limits<float>::quiet_NaN();
  for (DataType wire : {DataType::kQInt8, DataType::kQInt4}) {
    const size_t bytes = wireElements(wire, n) * dataTypeSize(wire);
    for (bool feedback : {false, true}) {
      std::vector<float> cpuRes(n), start(n);
      for (size_t i = 0; i < n; ++i) start[i] = feedback ? 0.01f * float(i % 7) - 0.03f : 0.0f;
      cpuRes = start;
      std::vector<uint8_t> cpu(bytes);
      kernels::narrow(cpu.data(), src.data(), n, wire, 0.5f, feedback ? cpuRes.data() : nullptr);
      DeviceBuffer<float> dsrc(n), dres(n), dwide(n);
      DeviceBuffer<uint8_t> dq(bytes);
      DeviceBuffer<int> flag(1);
      dsrc.upload(src);
      dres.upload(start);
      CUDA_OK(kc::narrow(dq.p, dsrc.p, n, {wire, 0.5f}, feedback ? dres.p : nullptr, nullptr));
      CUDA_OK(cudaMemset(flag.p, 0, sizeof(int)));
      CUDA_OK(kc::flagNonFinite(dq.p, wireElements(wire, n), wire, flag.p, nullptr));
      CUDA_OK(cudaDeviceSynchronize());
      ASSERT_EQ(dq.download(), cpu) << toString(wire) << " feedback " << feedback;
      if (feedback) {
        ASSERT_EQ(0, std::memcmp(dres.download().data(), cpuRes.data(), n * 4));
      }
      ASSERT_EQ(flag.download()[0], 1);  // the NaN block
      std::vector<float> cpuWide(n);
      kernels::widen(cpuWide.data(), cpu.data(), n, wire, 3.0f);
      CUDA_OK(kc::widen(dwide.p, dq.p, n, {wire, 3.0f}, nullptr));
      CUDA_OK(cudaDeviceSynchronize());
      ASSERT_EQ(0, std::memcmp(dwide.download().data(), cpuWide.data(), n * sizeof(float)));
    }
  }
}

TEST(GpuKernels, ScaleMatchesTheCpuMultiplyBitForBit) {
  REQUIRE_GPU();
  const size_t n = 100003;
  std::vector<float> src = interesting(n, 2);
  src[n - 1] = std::numeric_limits<float>::denorm_min();
  src[n - 2] = std::numeric_limits<float>::quiet_NaN();
  DeviceBuffer<float> d(n);
  for (float k : {0.25f, 1.0f / 3.0f, -7.5f, 1e-30f}) {
    d.upload(src);
    CUDA_OK(kc::scale(d.p, n, k, nullptr));
    CUDA_OK(cudaDeviceSynchronize());
    const std::vector<float> gpu = d.download();
    for (size_t i = 0; i < n; ++i) {
      const float cpu = src[i] * k;
      if (std::isnan(cpu)) {
        ASSERT_TRUE(std::isnan(gpu[i])) << i;  // a NaN's payload is the GPU's own
        continue;
      }
      ASSERT_EQ(0, std::memcmp(&gpu[i], &cpu, sizeof(float)))
          << "scale " << k << " i " << i << " x " << src[i] << " gpu " << gpu[i] << " cpu " << cpu;
    }
  }
}

TEST(GpuKernels, NonFiniteFlagAgreesWithTheCpuScan) {
  REQUIRE_GPU();
  std::vector<float> v(5000, 1.0f);
  DeviceBuffer<float> d(v.size());
  DeviceBuffer<int> flag(1);
  for (float bad : {1.0f, std::numeric_limits<float>::infinity(), std::nanf("")}) {
    v[4321] = bad;
    d.upload(v);
    flag.upload({0});
    CUDA_OK(kc::flagNonFinite(d.p, v.size(), DataType::kFloat32, flag.p, nullptr));
    CUDA_OK(cudaDeviceSynchronize());
    EXPECT_EQ(flag.download()[0] != 0,
              kernels::anyNonFinite(v.data(), v.size(), DataType::kFloat32));
  }
}

TEST(GpuKernels, BatchedCopyPacksAndUnpacksEverySegment) {
  REQUIRE_GPU();
  const std::vector<size_t> sizes = {1, 15, 16, 17, 4096, 100001, 0, 3};
  size_t total = 0;
  for (size_t s : sizes) total += s;
  std::vector<char> host(total);
  for (size_t i = 0; i < total; ++i) host[i] = static_cast<char>(i * 7 + 3);
  DeviceBuffer<char> tensors(total + 64), packed(total + 64), back(total + 64);
  DeviceBuffer<kc::CopySegment> scratch(sizes.size());
  cudaMemcpy(tensors.p + 1, host.data(), total, cudaMemcpyHostToDevice);  // misaligned on purpose
  std::vector<kc::CopySegment> segs, unsegs;
  size_t off = 0;
  for (size_t s : sizes) {
    segs.push_back({tensors.p + 1 + off, packed.p + off, s});
    unsegs.push_back({packed.p + off, back.p + off, s});
    off += s;
  }
  CUDA_OK(kc::batchedCopy(segs.data(), segs.size(), scratch.p, nullptr));
  CUDA_OK(cudaDeviceSynchronize());
  CUDA_OK(kc::batchedCopy(unsegs.data(), unsegs.size(), scratch.p, nullptr));
  CUDA_OK(cudaDeviceSynchronize());
  std::vector<char> got(total);
  cudaMemcpy(got.data(), back.p, total, cudaMemcpyDeviceToHost);
  EXPECT_EQ(got, host);
}

TEST(GpuKernels, CscStepsMatchTheCpuTwins) {
  REQUIRE_GPU();
  const size_t n = 10 * 1024 + 77, chunk = 1024;
  const size_t chunks = kernels::numChunks(n, chunk);
  std::vector<float> g = interesting(n, 2), v(n, 0.5f), u(n, 0.25f);
  for (float& x : g) x = std::fmod(x, 8.0f);
  for (bool momentum : {false, true}) {
    std::vector<float> cv = v, cu = u, norms(chunks);
    for (size_t c = 0; c < chunks; ++c) {
      const size_t b = c * chunk, len = std::min(chunk, n - b);
      norms[c] = momentum ? kernels::accumulateMomentumL1(&cv[b], &cu[b], &g[b], 0.9f, len)
                          : kernels::accumulateL1(&cv[b], &g[b], len);
    }
    DeviceBuffer<float> dv(n), du(n), dg(n), dn(chunks);
    dv.upload(v);
    du.upload(u);
    dg.upload(g);
    CUDA_OK(kc::accumulateChunkNorms({dv.p, momentum ? du.p : nullptr, n, chunk}, dg.p, 0.9f, dn.p,
                                     nullptr));
    CUDA_OK(cudaDeviceSynchronize());
    // The element-wise update is the same arithmetic: bit for bit.
    EXPECT_TRUE(sameFloats(dv.download(), cv));
    if (momentum) {
      EXPECT_TRUE(sameFloats(du.download(), cu));
    }
    // The norms are sums in another order: within float32 reassociation.
    const std::vector<float> gn = dn.download();
    // A chunk holding a NaN has a NaN norm on both.
    for (size_t c = 0; c < chunks; ++c) {
      if (std::isnan(norms[c])) {
        EXPECT_TRUE(std::isnan(gn[c])) << c;
      } else {
        EXPECT_NEAR(gn[c], norms[c], 1e-5f * norms[c] + 1e-6f) << c;
      }
    }

    // Selection on the CPU's norms (with ties and a NaN) is exact.
    std::vector<float> sel = norms;
    sel[3] = sel[5];
    sel[7] = std::nanf("");
    for (size_t k : {size_t{0}, size_t{1}, size_t{3}, chunks}) {
      const std::vector<size_t> want = kernels::topChunks(sel.data(), chunks, k);
      DeviceBuffer<float> dsel(chunks);
      dsel.upload(sel);
      DeviceBuffer<uint32_t> idx(chunks);
      const size_t tb = kc::topChunksTempBytes(chunks);
      DeviceBuffer<char> temp(tb);
      CUDA_OK(kc::topChunks(dsel.p, chunks, k, idx.p, {temp.p, tb}, nullptr));
      CUDA_OK(cudaDeviceSynchronize());
      const std::vector<uint32_t> got = idx.download();
      for (size_t j = 0; j < k; ++j) ASSERT_EQ(got[j], want[j]) << "k " << k << " j " << j;
    }

    // Gather the picked chunks (the last one short), scatter them back.
    const std::vector<uint32_t> picks = {0, 4, static_cast<uint32_t>(chunks - 1)};
    DeviceBuffer<uint32_t> dpicks(picks.size());
    dpicks.upload(picks);
    DeviceBuffer<float> packed(picks.size() * chunk), grad(n);
    CUDA_OK(
        kc::gatherChunks(packed.p, {dv.p, nullptr, n, chunk}, {dpicks.p, picks.size()}, nullptr));
    CUDA_OK(kc::scatterChunks(grad.p, {dv.p, momentum ? du.p : nullptr, n, chunk}, packed.p,
                              {dpicks.p, picks.size()}, nullptr));
    CUDA_OK(cudaDeviceSynchronize());
    const std::vector<float> gp = packed.download(), gg = grad.download(), gv = dv.download();
    for (size_t j = 0; j < picks.size(); ++j) {
      for (size_t t = 0; t < chunk; ++t) {
        const size_t e = picks[j] * chunk + t;
        ASSERT_TRUE(same(gp[j * chunk + t], e < n ? cv[e] : 0.0f)) << e;
        if (e < n) {
          ASSERT_TRUE(same(gg[e], cv[e])) << e;
          ASSERT_EQ(gv[e], 0.0f);
        }
      }
    }
    EXPECT_EQ(gg[chunk + 1], 0.0f);  // not picked: zero gradient, residual kept
    EXPECT_TRUE(same(gv[chunk + 1], cv[chunk + 1]));
  }
}

}  // namespace
}  // namespace gflow
