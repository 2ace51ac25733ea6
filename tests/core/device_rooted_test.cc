// Reduce, gather, scatter, all-to-all and point-to-point on cuda tensors (the software CUDA
// and NCCL of tests/testing), ranks as threads, against exact references.
// Three ranks on one soft GPU stage them through the host algorithms; one
// soft GPU per rank makes NCCL run the communicator's device ops, and these
// ops are still staged (docs/backends.md), so both paths must give the
// exact results and leave no device or pinned memory behind.
#include <gtest/gtest.h>

#include <cstring>
#include <vector>

#include "gflow/gflow.h"
#include "testing/ranks.h"
#include "testing/soft_gpus.h"

namespace gflow {
namespace {

namespace softcuda = testing::softcuda;

constexpr int kRanks = 3;
constexpr size_t kBlock = 1500;

int64_t tagged(int rank, size_t block, size_t i) {
  return rank * 1000003LL + static_cast<int64_t>(block) * 1009 + static_cast<int64_t>(i);
}

// A soft-GPU copy of `host` on `gpu`, as an int64 tensor.
struct OnGpu {
  OnGpu(int gpu, const std::vector<int64_t>& host) : gpu(gpu), count(host.size()) {
    mem = softcuda::alloc(gpu, std::max<size_t>(count, 1) * sizeof(int64_t));
    if (count > 0) std::memcpy(mem, host.data(), count * sizeof(int64_t));
  }
  ~OnGpu() { softcuda::free(mem); }
  Tensor t() const { return Tensor(mem, count, DataType::kInt64, Device{DeviceType::kCUDA, gpu}); }
  std::vector<int64_t> values() const {
    const auto* p = static_cast<const int64_t*>(mem);
    return std::vector<int64_t>(p, p + count);
  }
  int gpu;
  size_t count;
  void* mem;
};

class DeviceRooted : public testing::OnSoftGpus<kRanks, ::testing::TestWithParam<bool>> {
 protected:
  int gpuOf(int rank) const { return GetParam() ? rank : 0; }  // true: NCCL communicator
};

TEST_P(DeviceRooted, EveryRootedOpAndAlltoallIsExact) {
  testing::runRanks(kRanks, [&](Communicator& c) {
    const int r = c.rank(), n = c.size(), g = gpuOf(r);
    const int root = n - 1;
    // reduce (sum) to the root
    std::vector<int64_t> mine(kBlock);
    for (size_t i = 0; i < kBlock; ++i) mine[i] = tagged(r, 0, i);
    OnGpu in(g, mine), out(g, std::vector<int64_t>(kBlock, -1));
    c.reduce(in.t(), out.t(), root, ReduceOp::kSum);
    for (size_t i = 0; i < kBlock; ++i) {
      const int64_t sum = tagged(0, 0, i) + tagged(1, 0, i) + tagged(2, 0, i);
      ASSERT_EQ(out.values()[i], r == root ? sum : -1) << "reduce, rank " << r << " i " << i;
    }
    // gather to the root
    OnGpu all(g, std::vector<int64_t>(kBlock * n, -1));
    c.gather(in.t(), all.t(), root);
    for (int j = 0; j < n && r == root; ++j) {
      for (size_t i = 0; i < kBlock; ++i) ASSERT_EQ(all.values()[j * kBlock + i], tagged(j, 0, i));
    }
    // scatter from the root
    std::vector<int64_t> blocks(kBlock * n);
    for (int j = 0; j < n; ++j) {
      for (size_t i = 0; i < kBlock; ++i) blocks[j * kBlock + i] = tagged(root, j, i);
    }
    OnGpu src(g, blocks), got(g, std::vector<int64_t>(kBlock, -1));
    c.scatter(src.t(), got.t(), root);
    for (size_t i = 0; i < kBlock; ++i) ASSERT_EQ(got.values()[i], tagged(root, r, i));
    // all-to-all
    for (int j = 0; j < n; ++j) {
      for (size_t i = 0; i < kBlock; ++i) blocks[j * kBlock + i] = tagged(r, j, i);
    }
    OnGpu send(g, blocks), recv(g, std::vector<int64_t>(kBlock * n, -1));
    c.alltoall(send.t(), recv.t());
    for (int j = 0; j < n; ++j) {
      for (size_t i = 0; i < kBlock; ++i) ASSERT_EQ(recv.values()[j * kBlock + i], tagged(j, r, i));
    }
    // point-to-point: a sendRecv ring, then rank 0's host buffer into
    // rank 1's device buffer
    OnGpu from(g, std::vector<int64_t>(kBlock, -1));
    c.sendRecv({P2POp::send(in.t(), (r + 1) % n), P2POp::recv(from.t(), (r + n - 1) % n)});
    for (size_t i = 0; i < kBlock; ++i) ASSERT_EQ(from.values()[i], tagged((r + n - 1) % n, 0, i));
    if (r == 0) c.send(tensor(mine.data(), kBlock), 1, 9);
    if (r == 1) {
      EXPECT_EQ(c.recv(from.t(), 0, 9), 0);
      for (size_t i = 0; i < kBlock; ++i) ASSERT_EQ(from.values()[i], tagged(0, 0, i));
    }
    EXPECT_EQ(c.stats().stagedOps, r == 1 ? 6u : 5u);
  });
}

INSTANTIATE_TEST_SUITE_P(, DeviceRooted, ::testing::Values(false, true),
                         [](const ::testing::TestParamInfo<bool>& i) {
                           return i.param ? "OneGpuPerRankNccl" : "SharedGpuStaged";
                         });

}  // namespace
}  // namespace gflow
