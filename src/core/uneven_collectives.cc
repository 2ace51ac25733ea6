// The front doors of the uneven (v) forms: allgatherv, gatherv, scatterv,
// reduceScatterv and alltoallv. Each checks its counts (one per rank, every
// block inside its tensor), binds its buffers and submits one op. The counts
// that every rank passes alike travel as a digest in the op's description
// (OpDesc::parent), so ranks that disagree raise kMismatch; alltoallv's
// counts differ by rank, and its receivers compare each block's size.
#include <algorithm>
#include <cstring>
#include <memory>
#include <numeric>
#include <string>
#include <vector>

#include "backend/device_buffers.h"
#include "core/communicator_impl.h"
#include "core/op_checks.h"
#include "gflow/communicator.h"

namespace gflow {

using backend::Algorithm;
using backend::Blocks;
using backend::OpDesc;
using backend::OpKind;

namespace {

using Buffers = backend::DeviceBuffers;
using opcheck::Named;
using opcheck::overlap;

std::string str(uint64_t v) {
  return std::to_string(v);
}

// One count per rank, none (nor their sum) beyond what a tensor may hold.
std::vector<uint64_t> checkCounts(CommunicatorImpl& I, const char* name, const char* what,
                                  const std::vector<size_t>& counts) {
  if (counts.size() != static_cast<size_t>(I.commSize())) {
    I.invalid(name, std::string(what) + " has " + str(counts.size()) +
                        " entries, not one per rank (" + str(I.commSize()) + ")");
  }
  const uint64_t limit = uint64_t(1) << 46;
  uint64_t sum = 0;
  for (size_t c : counts) {
    if (c > limit || sum + c > limit) I.invalid(name, std::string(what) + " is too large");
    sum += c;
  }
  return std::vector<uint64_t>(counts.begin(), counts.end());
}

// A tensor of an uneven op with its per-rank blocks, as the caller gave them.
struct UnevenTensor {
  Tensor tensor;
  const std::vector<size_t>& counts;
  const std::vector<size_t>& offsets;
};

// The blocks of `u` (named `what`): each inside its tensor, and (disjoint)
// none overlapping.
Blocks checkBlocks(CommunicatorImpl& I, const char* name, const char* what, const UnevenTensor& u,
                   bool disjoint) {
  const Tensor& t = u.tensor;
  const std::vector<size_t>& counts = u.counts;
  const std::vector<size_t>& offsets = u.offsets;
  Blocks b;
  b.counts = checkCounts(I, name, (std::string(what) + " counts").c_str(), counts);
  if (offsets.size() != counts.size()) {
    I.invalid(name, std::string(what) + " offsets has " + str(offsets.size()) +
                        " entries, not one per rank (" + str(counts.size()) + ")");
  }
  b.offsets.assign(offsets.begin(), offsets.end());
  for (size_t j = 0; j < counts.size(); ++j) {
    if (b.offsets[j] > t.count || b.counts[j] > t.count - b.offsets[j]) {
      I.invalid(name, std::string(what) + " block " + str(j) + " [" + str(b.offsets[j]) + ", +" +
                          str(b.counts[j]) + ") is outside its tensor (" + str(t.count) +
                          " elements)");
    }
  }
  if (!disjoint) return b;
  std::vector<size_t> order(counts.size());
  std::iota(order.begin(), order.end(), size_t(0));
  std::sort(order.begin(), order.end(),
            [&](size_t x, size_t y) { return b.offsets[x] < b.offsets[y]; });
  for (size_t k = 1; k < order.size(); ++k) {
    const size_t p = order[k - 1], q = order[k];
    if (b.counts[p] > 0 && b.counts[q] > 0 && b.offsets[p] + b.counts[p] > b.offsets[q]) {
      I.invalid(name, std::string(what) + " blocks " + str(p) + " and " + str(q) + " overlap");
    }
  }
  return b;
}

void sameDtype(CommunicatorImpl& I, const char* name, const Tensor& a, const Tensor& b) {
  if (a.dtype != b.dtype) {
    I.invalid(name, std::string("in is ") + toString(a.dtype) + " but out is " + toString(b.dtype));
  }
}

void expectCount(CommunicatorImpl& I, const char* name, const char* what, const Tensor& t,
                 uint64_t want, const char* why) {
  if (t.count != want) {
    I.invalid(name, std::string(what) + ".count (" + str(t.count) + ") must be " + why + " (" +
                        str(want) + ")");
  }
}

// `s` is either block `index` of `g` (in place) or disjoint from it.
bool inPlace(CommunicatorImpl& I, const char* name, Named s, Named g, const Blocks& b, int index) {
  const Tensor& small = s.tensor;
  const Tensor& big = g.tensor;
  const char* smallName = s.name;
  const char* bigName = g.name;
  const char* own = static_cast<const char*>(big.data) + b.offsets[index] * dataTypeSize(big.dtype);
  const bool same = small.data == own;
  if (!same && overlap(small.data, small.nbytes(), big.data, big.nbytes())) {
    I.invalid(name, std::string(smallName) + " overlaps " + bigName +
                        " but is not this rank's block of " + bigName);
  }
  return same;
}

OpDesc unevenDesc(OpKind kind, DataType dtype, int root, const Blocks& b) {
  OpDesc d{kind, dtype, ReduceOp::kSum, Algorithm::kAuto, root, b.total()};
  d.parent = backend::blocksDigest(b.counts);
  return d;
}

std::shared_ptr<WorkState> doAllgatherv(CommunicatorImpl& I, Tensor in, Tensor out,
                                        const std::vector<size_t>& counts, bool blocking) {
  const char* name = "allgatherv";
  I.checkUsable(name);
  I.validateTensor(name, "in", in);
  I.validateTensor(name, "out", out);
  sameDtype(I, name, in, out);
  const int me = I.commRank();
  const Blocks outBlocks = Blocks::packed(checkCounts(I, name, "counts", counts));
  expectCount(I, name, "in", in, outBlocks.counts[me], "counts[rank]");
  expectCount(I, name, "out", out, outBlocks.total(), "the sum of counts");
  const bool same = inPlace(I, name, {in, "in"}, {out, "out"}, outBlocks, me);
  // Every rank's in block for every peer is its whole input.
  Blocks inBlocks;
  inBlocks.counts.assign(counts.size(), outBlocks.counts[me]);
  inBlocks.offsets.assign(counts.size(), 0);
  CommunicatorImpl* self = &I;
  auto buffers = same ? Buffers::bind(I.binding(name), {{out, Buffers::kInOut}})
                      : Buffers::bind(I.binding(name), {{in, Buffers::kIn}, {out, Buffers::kOut}});
  return I.submit(
      unevenDesc(OpKind::kAllgatherv, in.dtype, 0, outBlocks), blocking,
      [self, in, out, inBlocks, outBlocks](const backend::Op& o) {
        self->router().alltoallv(o, in.data, inBlocks, out.data, outBlocks);
      },
      std::move(buffers));
}

// Which rooted uneven op, and its root.
struct Rooting {
  bool gather;  // gatherv; else scatterv
  int root;
};

// gatherv (`small` in, `big` out) and scatterv (`small` out, `big` in).
std::shared_ptr<WorkState> doRootedv(CommunicatorImpl& I, Rooting how, Tensor small, Tensor big,
                                     const std::vector<size_t>& counts, bool blocking) {
  const bool gather = how.gather;
  const int root = how.root;
  const char* name = gather ? "gatherv" : "scatterv";
  const char* smallName = gather ? "in" : "out";
  const char* bigName = gather ? "out" : "in";
  I.checkUsable(name);
  I.validateTensor(name, smallName, small);
  opcheck::checkRoot(I, name, root);
  const int me = I.commRank();
  const Blocks blocks = Blocks::packed(checkCounts(I, name, "counts", counts));
  expectCount(I, name, smallName, small, blocks.counts[me], "counts[rank]");
  const bool atRoot = me == root;
  bool same = false;
  if (atRoot) {
    I.validateTensor(name, bigName, big);
    sameDtype(I, name, gather ? small : big, gather ? big : small);
    expectCount(I, name, bigName, big, blocks.total(), "the sum of counts");
    same = inPlace(I, name, {small, smallName}, {big, bigName}, blocks, me);
  }
  const auto smallRole = gather ? Buffers::kIn : Buffers::kOut;
  const auto bigRole = gather ? Buffers::kOut : Buffers::kIn;
  auto buffers = !atRoot ? Buffers::bind(I.binding(name), {{small, smallRole}})
                 : same  ? Buffers::bind(I.binding(name), {{big, Buffers::kInOut}})
                         : Buffers::bind(I.binding(name), {{small, smallRole}, {big, bigRole}});
  void* bigData = atRoot ? big.data : nullptr;
  CommunicatorImpl* self = &I;
  return I.submit(
      unevenDesc(gather ? OpKind::kGatherv : OpKind::kScatterv, small.dtype, root, blocks),
      blocking,
      [self, gather, small, bigData, blocks](const backend::Op& o) {
        if (gather) return self->router().gatherv(o, small.data, bigData, blocks);
        self->router().scatterv(o, bigData, blocks, small.data);
      },
      std::move(buffers));
}

std::shared_ptr<WorkState> doReduceScatterv(CommunicatorImpl& I, Tensor in, Tensor out,
                                            const std::vector<size_t>& counts, ReduceOp op,
                                            bool blocking) {
  const char* name = "reduceScatterv";
  I.checkUsable(name);
  I.validateTensor(name, "in", in);
  I.validateTensor(name, "out", out);
  I.validateOp(name, op, in.dtype);
  sameDtype(I, name, in, out);
  if (in.device.type != DeviceType::kCPU || out.device.type != DeviceType::kCPU) {
    I.invalid(name, "takes host tensors (it reduces through host scratch memory)");
  }
  const int me = I.commRank();
  const Blocks blocks = Blocks::packed(checkCounts(I, name, "counts", counts));
  expectCount(I, name, "in", in, blocks.total(), "the sum of counts");
  expectCount(I, name, "out", out, blocks.counts[me], "counts[rank]");
  if (overlap(in.data, in.nbytes(), out.data, out.nbytes())) {
    I.invalid(name, "in and out must not overlap");
  }
  OpDesc d{OpKind::kAllreduce, in.dtype, op, {}, 0, blocks.total()};
  d.reproducible = I.reproducible(in.dtype);
  d.parent = backend::blocksDigest(blocks.counts);
  CommunicatorImpl* self = &I;
  return I.submit(
      d, blocking,
      [self, in, out, me, blocks](const backend::Op& o) {
        const size_t es = dataTypeSize(in.dtype);
        // Scratch the allreduce overwrites whole: left uninitialised.
        std::unique_ptr<char[]> all(new char[in.nbytes() > 0 ? in.nbytes() : 1]);
        self->router().allreduce(o, in.data, all.get());
        if (out.count > 0) std::memcpy(out.data, all.get() + blocks.offsets[me] * es, out.nbytes());
      },
      nullptr, name);
}

std::shared_ptr<WorkState> doAlltoallv(CommunicatorImpl& I, const UnevenTensor& from,
                                       const UnevenTensor& to, bool blocking) {
  const char* name = "alltoallv";
  const Tensor in = from.tensor, out = to.tensor;
  I.checkUsable(name);
  I.validateTensor(name, "in", in);
  I.validateTensor(name, "out", out);
  sameDtype(I, name, in, out);
  const Blocks inBlocks = checkBlocks(I, name, "in", from, false);
  const Blocks outBlocks = checkBlocks(I, name, "out", to, true);
  const int me = I.commRank();
  if (inBlocks.counts[me] != outBlocks.counts[me]) {
    I.invalid(name, "inCounts[rank] (" + str(inBlocks.counts[me]) +
                        ") must equal outCounts[rank] (" + str(outBlocks.counts[me]) +
                        "): the block this rank keeps");
  }
  if (overlap(in.data, in.nbytes(), out.data, out.nbytes())) {
    I.invalid(name, "in and out must not overlap");
  }
  CommunicatorImpl* self = &I;
  // Blocks that leave gaps in `out`: staging copies it in too, so the gaps
  // go back to the device as they were.
  const auto outRole = outBlocks.total() < out.count ? Buffers::kInOut : Buffers::kOut;
  auto buffers = Buffers::bind(I.binding(name), {{in, Buffers::kIn}, {out, outRole}});
  // The ranks' counts differ: the description carries none.
  OpDesc d{OpKind::kAlltoallv, in.dtype, ReduceOp::kSum, Algorithm::kAuto, 0, 0};
  return I.submit(
      d, blocking,
      [self, in, out, inBlocks, outBlocks](const backend::Op& o) {
        self->router().alltoallv(o, in.data, inBlocks, out.data, outBlocks);
      },
      std::move(buffers));
}

}  // namespace

void Communicator::allgatherv(Tensor in, Tensor out, const std::vector<size_t>& counts) {
  opcheck::finish(doAllgatherv(impl(*this), in, out, counts, true));
}
void Communicator::gatherv(Tensor in, Tensor out, const std::vector<size_t>& counts, int root) {
  opcheck::finish(doRootedv(impl(*this), {true, root}, in, out, counts, true));
}
void Communicator::scatterv(Tensor in, Tensor out, const std::vector<size_t>& counts, int root) {
  opcheck::finish(doRootedv(impl(*this), {false, root}, out, in, counts, true));
}
void Communicator::reduceScatterv(Tensor in, Tensor out, const std::vector<size_t>& counts,
                                  ReduceOp op) {
  opcheck::finish(doReduceScatterv(impl(*this), in, out, counts, op, true));
}
void Communicator::alltoallv(Tensor in, const std::vector<size_t>& inCounts,
                             const std::vector<size_t>& inOffsets, Tensor out,
                             const std::vector<size_t>& outCounts,
                             const std::vector<size_t>& outOffsets) {
  opcheck::finish(
      doAlltoallv(impl(*this), {in, inCounts, inOffsets}, {out, outCounts, outOffsets}, true));
}

Work Communicator::allgathervAsync(Tensor in, Tensor out, const std::vector<size_t>& counts) {
  return Work(doAllgatherv(impl(*this), in, out, counts, false));
}
Work Communicator::gathervAsync(Tensor in, Tensor out, const std::vector<size_t>& counts,
                                int root) {
  return Work(doRootedv(impl(*this), {true, root}, in, out, counts, false));
}
Work Communicator::scattervAsync(Tensor in, Tensor out, const std::vector<size_t>& counts,
                                 int root) {
  return Work(doRootedv(impl(*this), {false, root}, out, in, counts, false));
}
Work Communicator::reduceScattervAsync(Tensor in, Tensor out, const std::vector<size_t>& counts,
                                       ReduceOp op) {
  return Work(doReduceScatterv(impl(*this), in, out, counts, op, false));
}
Work Communicator::alltoallvAsync(Tensor in, const std::vector<size_t>& inCounts,
                                  const std::vector<size_t>& inOffsets, Tensor out,
                                  const std::vector<size_t>& outCounts,
                                  const std::vector<size_t>& outOffsets) {
  return Work(
      doAlltoallv(impl(*this), {in, inCounts, inOffsets}, {out, outCounts, outOffsets}, false));
}

}  // namespace gflow
