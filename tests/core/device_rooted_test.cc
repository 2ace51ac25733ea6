// Reduce, gather, scatter, all-to-all, the uneven forms and point-to-point
// on cuda tensors (the software CUDA and NCCL of tests/testing), ranks as
// threads, against exact references. Three ranks on one soft GPU stage them
// through the host algorithms; one soft GPU per rank makes NCCL run them
// (ncclReduce, grouped ncclSend/ncclRecv), except point-to-point, which is
// staged (docs/backends.md). Both paths must give the exact results and
// leave no device or pinned memory behind.
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
    // On NCCL only point-to-point is staged: the sendRecv ring, and rank
    // 1's receive into device memory.
    const bool nccl = GetParam();
    const uint64_t p2p = r == 1 ? 2u : 1u;
    EXPECT_EQ(c.stats().stagedOps, nccl ? p2p : p2p + 4u);
    EXPECT_EQ(c.stats().ncclOps, nccl ? 4u : 0u);
  });
}

// Rank r's count for rank j in the uneven tests: uneven, with zeros.
size_t unevenCount(int from, int to) {
  return static_cast<size_t>((from * 7 + to * 3) % 5) * 301;
}

TEST_P(DeviceRooted, UnevenFormsAndInPlaceRootedOpsAreExact) {
  testing::runRanks(kRanks, [&](Communicator& c) {
    const int r = c.rank(), n = c.size(), g = gpuOf(r), root = 1;
    std::vector<size_t> counts(n), offsets(n);
    size_t total = 0;
    for (int j = 0; j < n; ++j) {
      counts[j] = unevenCount(j, j) + 17;
      offsets[j] = total;
      total += counts[j];
    }
    std::vector<int64_t> mine(counts[r]);
    for (size_t i = 0; i < mine.size(); ++i) mine[i] = tagged(r, 7, i);
    // allgatherv and gatherv: rank j's block at offsets[j]
    OnGpu in(g, mine), all(g, std::vector<int64_t>(total, -1)), rooted(g, all.values());
    c.allgatherv(in.t(), all.t(), counts);
    c.gatherv(in.t(), rooted.t(), counts, root);
    for (int j = 0; j < n; ++j) {
      for (size_t i = 0; i < counts[j]; ++i) {
        ASSERT_EQ(all.values()[offsets[j] + i], tagged(j, 7, i)) << "allgatherv";
        ASSERT_EQ(rooted.values()[offsets[j] + i], r == root ? tagged(j, 7, i) : -1) << "gatherv";
      }
    }
    // scatterv back from the root's gathered buffer
    OnGpu back(g, std::vector<int64_t>(counts[r], -1));
    c.scatterv(all.t(), back.t(), counts, root);
    EXPECT_EQ(back.values(), mine) << "scatterv";
    // alltoallv: rank r sends unevenCount(r, j) elements to j, packed
    std::vector<size_t> inCounts(n), inOffsets(n), outCounts(n), outOffsets(n);
    size_t inTotal = 0, outTotal = 0;
    for (int j = 0; j < n; ++j) {
      inCounts[j] = unevenCount(r, j);
      outCounts[j] = unevenCount(j, r);
      inOffsets[j] = inTotal;
      outOffsets[j] = outTotal;
      inTotal += inCounts[j];
      outTotal += outCounts[j];
    }
    std::vector<int64_t> send(inTotal);
    for (int j = 0; j < n; ++j) {
      for (size_t i = 0; i < inCounts[j]; ++i) send[inOffsets[j] + i] = tagged(r, j, i);
    }
    OnGpu src(g, send), dst(g, std::vector<int64_t>(outTotal + 1, -1));
    c.alltoallv(src.t(), inCounts, inOffsets, dst.t(), outCounts, outOffsets);
    for (int j = 0; j < n; ++j) {
      for (size_t i = 0; i < outCounts[j]; ++i) {
        ASSERT_EQ(dst.values()[outOffsets[j] + i], tagged(j, r, i)) << "alltoallv from " << j;
      }
    }
    EXPECT_EQ(dst.values()[outTotal], -1) << "alltoallv wrote outside its blocks";
    // gather and scatter in place: the root's block of the big buffer
    OnGpu big(g, std::vector<int64_t>(kBlock * n, -1));
    std::vector<int64_t> own(kBlock);
    for (size_t i = 0; i < kBlock; ++i) own[i] = tagged(r, 3, i);
    OnGpu small(g, own);
    if (r == root)
      std::memcpy(static_cast<int64_t*>(big.mem) + root * kBlock, own.data(), kBlock * 8);
    const Tensor rootBlock(static_cast<int64_t*>(big.mem) + root * kBlock, kBlock, DataType::kInt64,
                           Device{DeviceType::kCUDA, g});
    c.gather(r == root ? rootBlock : small.t(), big.t(), root);
    for (int j = 0; j < n && r == root; ++j) {
      for (size_t i = 0; i < kBlock; ++i) ASSERT_EQ(big.values()[j * kBlock + i], tagged(j, 3, i));
    }
    OnGpu out(g, std::vector<int64_t>(kBlock, -1));
    c.scatter(big.t(), r == root ? rootBlock : out.t(), root);
    const std::vector<int64_t> whole = big.values();
    const std::vector<int64_t> got = r == root
                                         ? std::vector<int64_t>(whole.begin() + root * kBlock,
                                                                whole.begin() + (root + 1) * kBlock)
                                         : out.values();
    for (size_t i = 0; i < kBlock; ++i) ASSERT_EQ(got[i], tagged(r, 3, i)) << "scatter";
    EXPECT_EQ(c.stats().ncclOps, GetParam() ? 6u : 0u);
  });
}

INSTANTIATE_TEST_SUITE_P(, DeviceRooted, ::testing::Values(false, true),
                         [](const ::testing::TestParamInfo<bool>& i) {
                           return i.param ? "OneGpuPerRankNccl" : "SharedGpuStaged";
                         });

}  // namespace
}  // namespace gflow
