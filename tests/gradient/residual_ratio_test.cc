// residualRatios (gradient/auto_wire.h), the automatic wire's residual
// guard: per bucket, L1(residual) / L1(gradient) against a float64
// reference, on host memory and on the software GPU's memory (read through
// the CUDA kernels' copies to the host); and a failure to read them, which
// must reach the peers instead of leaving them in the agreement.
#include <gtest/gtest.h>

#include <algorithm>
#include <atomic>
#include <chrono>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <functional>
#include <memory>
#include <stdexcept>
#include <string>
#include <thread>
#include <vector>

#include "gflow/gflow.h"
#include "gradient/auto_wire.h"
#include "kernels/cuda_kernels.h"
#include "testing/ranks.h"
#include "testing/soft_cuda.h"

namespace gflow {
namespace {

namespace softcuda = testing::softcuda;

// One tensor per bucket: its gradient and residual, and the bucket's wire.
struct Bucket {
  std::vector<float> grad, residual;
  DataType wire;
};

// A bucket of `n` values: the gradient cycles through magnitudes 1..7 with
// alternating signs, the residual is `k` times each.
Bucket cycling(size_t n, float k, DataType wire) {
  Bucket b{std::vector<float>(n), std::vector<float>(n), wire};
  for (size_t i = 0; i < n; ++i) {
    b.grad[i] = static_cast<float>(1 + i % 7) * (i % 2 ? -1.0f : 1.0f);
    b.residual[i] = k * b.grad[i];
  }
  return b;
}

double referenceRatio(const Bucket& b) {
  double r = 0, g = 0;
  for (size_t i = 0; i < b.grad.size(); ++i) {
    r += std::fabs(static_cast<double>(b.residual[i]));
    g += std::fabs(static_cast<double>(b.grad[i]));
  }
  return g > 0 ? r / g : (r > 0 ? 1e300 : 0.0);
}

std::vector<Bucket> buckets() {
  std::vector<Bucket> v;
  v.push_back(cycling(1000, 0.25f, DataType::kQInt8));  // read whole
  // Beyond 64 Ki values: sampled (the residual is half of every value, so
  // any sample's ratio is the whole's).
  v.push_back(cycling(300007, 0.5f, DataType::kQInt4));
  v.push_back(cycling(500, 3.0f, DataType::kFloat32));  // not quantized: 0
  Bucket zero = cycling(64, 0.1f, DataType::kQInt4);    // zero gradient, residual left
  std::fill(zero.grad.begin(), zero.grad.end(), 0.0f);
  v.push_back(zero);
  Bucket tiny = cycling(10, 0.0f, DataType::kQInt8);  // nothing lost: 0
  v.push_back(tiny);
  // A residual far past its gradient, in its last value only.
  Bucket last = cycling(200000, 0.0f, DataType::kQInt8);
  last.residual.back() = 1e9f;
  v.push_back(last);
  return v;
}

// residualRatios over `bs`, whose memory `place` copies (host: as is).
std::vector<double> ratios(const std::vector<Bucket>& bs, kernels::GradientKernels* device,
                           const std::function<float*(const std::vector<float>&)>& place) {
  gradient::BucketPlan plan;
  std::vector<Tensor> tensors;
  std::vector<float*> residuals;
  std::vector<DataType> wires;
  for (size_t i = 0; i < bs.size(); ++i) {
    gradient::Bucket b;
    b.tensors = {i};
    plan.buckets.push_back(b);
    plan.bucketOf.push_back(i);
    tensors.emplace_back(place(bs[i].grad), bs[i].grad.size(), DataType::kFloat32);
    residuals.push_back(place(bs[i].residual));
    wires.push_back(bs[i].wire);
  }
  return gradient::residualRatios(plan, tensors, residuals, wires, device);
}

void expectReference(const std::vector<Bucket>& bs, const std::vector<double>& got) {
  ASSERT_EQ(got.size(), bs.size());
  EXPECT_DOUBLE_EQ(got[0], referenceRatio(bs[0]));
  EXPECT_DOUBLE_EQ(got[1], referenceRatio(bs[1]));
  EXPECT_EQ(got[2], 0.0) << "a float32 bucket has no residual to guard";
  EXPECT_EQ(got[3], 1e300) << "a residual beside a zero gradient";
  EXPECT_EQ(got[4], 0.0);
  // The sample's last block ends at the tensor's last value.
  EXPECT_GT(got[5], 1.0) << "the last value was not sampled";
}

TEST(ResidualRatios, HostMemoryMatchesAFloat64Reference) {
  const std::vector<Bucket> bs = buckets();
  auto asIs = [](const std::vector<float>& v) { return const_cast<float*>(v.data()); };
  expectReference(bs, ratios(bs, nullptr, asIs));
}

TEST(ResidualRatios, DeviceMemoryIsReadThroughTheKernelsStream) {
  softcuda::install(1);
  std::vector<void*> mem;
  {
    kernels::CudaKernels cuda(*softcuda::plugin(), 0, nullptr, 4);
    auto onDevice = [&](const std::vector<float>& v) {
      mem.push_back(softcuda::alloc(0, v.size() * sizeof(float)));
      std::memcpy(mem.back(), v.data(), v.size() * sizeof(float));
      return static_cast<float*>(mem.back());
    };
    const std::vector<Bucket> bs = buckets();
    uint64_t sampled = 0;  // bytes of the quantized buckets' samples, both arrays
    for (const Bucket& b : bs) {
      if (isQuantized(b.wire)) sampled += 2 * std::min<size_t>(b.grad.size(), 65536) * 4;
    }
    const uint64_t before = softcuda::bytesCopied();
    const std::vector<double> got = ratios(bs, &cuda, onDevice);
    EXPECT_EQ(softcuda::bytesCopied() - before, sampled) << "not read through memcpyAsync";
    expectReference(bs, got);
  }
  for (void* p : mem) softcuda::free(p);
  softcuda::uninstall();
}

// Three ranks step an automatic wire that agrees every step; reading the
// residuals fails on rank 1 (`fail`). Rank 1 raises it (its message exactly
// `rank1Exactly` unless that is empty) and keeps its communicator, as a
// process handling the error would, until the others are done; ranks 0 and
// 2, already waiting in the agreement, get it naming rank 1 instead of
// timing out (a 120 s deadline: reaching it fails the test).
void expectAReadFailureReachesThePeers(const std::function<void()>& fail,
                                       const std::string& rank1Exactly) {
  Options o;
  o.timeout = std::chrono::seconds(120);
  std::atomic<int> peersDone{0};
  const std::vector<testing::Outcome> out = testing::runRanksOutcomes(
      3,
      [&peersDone, &fail](Communicator& c) {
        struct Done {
          Communicator& c;
          std::atomic<int>& peers;
          ~Done() {
            if (c.rank() != 1) {
              ++peers;
              return;
            }
            const auto limit = std::chrono::steady_clock::now() + std::chrono::seconds(150);
            while (peers.load() < 2 && std::chrono::steady_clock::now() < limit) {
              std::this_thread::sleep_for(std::chrono::milliseconds(5));
            }
          }
        } done{c, peersDone};
        gradient::WirePolicyConfig config;
        config.candidates = {DataType::kFloat32, DataType::kQInt8};
        config.period = 1;
        gradient::AutoWire wire(c, config, {true}, {"b0"}, nullptr);
        auto read = [&c, &fail]() -> std::vector<double> {
          if (c.rank() == 1) fail();
          return {0.0};
        };
        for (uint64_t step = 0; step < 20; ++step) {
          wire.bucketReady(0);
          wire.bucketDone(0);
          wire.stepDone(step, false, read);
        }
      },
      o);
  for (int r = 0; r < 3; ++r) {
    ASSERT_TRUE(out[r].threw) << "rank " << r << " never reached an agreement";
    EXPECT_NE(out[r].code, ErrorCode::kTimeout) << "rank " << r << ": " << out[r].what;
    EXPECT_NE(out[r].what.find("illegal memory access"), std::string::npos) << out[r].what;
    if (r == 1 && !rank1Exactly.empty()) {
      EXPECT_EQ(out[r].what, rank1Exactly);
      continue;
    }
    EXPECT_NE(out[r].what.find("residual guard on rank 1"), std::string::npos)
        << "rank " << r << ": " << out[r].what;
  }
}

TEST(ResidualRatios, AFailureToReadThemReachesThePeers) {
  expectAReadFailureReachesThePeers(
      [] { throw Error(ErrorCode::kInternal, "cudaMemcpyAsync: an illegal memory access"); }, "");
}

// Another exception (a Python callback's): rank 1 gets it as it is
// (runRanksOutcomes marks it "non-gflow: ").
TEST(ResidualRatios, AnotherExceptionReachesThePeersAndStaysOnItsRank) {
  expectAReadFailureReachesThePeers(
      [] { throw std::runtime_error("an illegal memory access in a Python callback"); },
      "non-gflow: an illegal memory access in a Python callback");
}

}  // namespace
}  // namespace gflow
