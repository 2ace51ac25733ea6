// The front doors of reduce, gather, scatter and all-to-all: each checks its
// arguments (naming the op, the argument and this rank), binds its buffers
// and submits one op to the router. A rooted op's result buffer (reduce,
// gather) and source buffer (scatter) exist on the root only: off the root
// they are neither checked nor touched, and may be empty tensors.
#include "backend/device_buffers.h"
#include "core/communicator_impl.h"
#include "core/op_checks.h"
#include "gflow/communicator.h"

namespace gflow {

using backend::Algorithm;
using backend::OpDesc;
using backend::OpKind;

namespace {

using Buffers = backend::DeviceBuffers;
using opcheck::Named;
using opcheck::overlap;

// Binds `mine` (this rank's buffer on every rank) and, on the root, `rootOnly`;
// `same`: the root's two are one buffer (in place).
std::shared_ptr<Buffers> bindRooted(CommunicatorImpl& I, const char* name, bool atRoot,
                                    const Buffers::Item& mine, const Buffers::Item& rootOnly,
                                    bool same) {
  if (!atRoot) return Buffers::bind(I.binding(name), {mine});
  if (same) return Buffers::bind(I.binding(name), {{rootOnly.t, Buffers::kInOut}});
  return Buffers::bind(I.binding(name), {mine, rootOnly});
}

// The root's checks of gather (`small` in, `big` out) and scatter (`small`
// out, `big` in): size() blocks, no overlap unless `small` is the root's own
// block of `big` (in place), which the return value says.
bool checkRootBlocks(CommunicatorImpl& I, const char* name, Named s, Named g, int root) {
  const Tensor& small = s.tensor;
  const Tensor& big = g.tensor;
  const char* smallName = s.name;
  const char* bigName = g.name;
  opcheck::checkBlocks(I, name, small, smallName, big, bigName);
  const bool same = small.data == opcheck::blockOf(big, small, root);
  if (!same && overlap(small.data, small.nbytes(), big.data, big.nbytes())) {
    I.invalid(name, std::string(smallName) + " overlaps " + bigName +
                        " but is not the root's block of " + bigName);
  }
  if (same && small.device.type != big.device.type) {
    I.invalid(name, std::string(smallName) + " is the root's block of " + bigName +
                        " but on another device");
  }
  return same;
}

std::shared_ptr<WorkState> doReduce(CommunicatorImpl& I, Tensor in, Tensor out, ReduceOp op,
                                    int root, bool blocking) {
  const char* name = "reduce";
  I.checkUsable(name);
  I.validateTensor(name, "in", in);
  I.validateOp(name, op, in.dtype);
  opcheck::checkRoot(I, name, root);
  const bool atRoot = I.commRank() == root;
  const bool same = atRoot && in.data == out.data;
  if (atRoot) {
    I.validateTensor(name, "out", out);
    if (in.count != out.count || in.dtype != out.dtype) {
      I.invalid(name, "out (" + std::to_string(out.count) + " x " + toString(out.dtype) +
                          ") must match in (" + std::to_string(in.count) + " x " +
                          toString(in.dtype) + ") on the root");
    }
    if (!same && overlap(in.data, in.nbytes(), out.data, out.nbytes())) {
      I.invalid(name, "in and out overlap without being the same buffer");
    }
  }
  OpDesc d{OpKind::kReduce, in.dtype, op, Algorithm::kAuto, root, in.count};
  CommunicatorImpl* self = &I;
  auto buffers = bindRooted(I, name, atRoot, {in, Buffers::kIn}, {out, Buffers::kOut}, same);
  void* dst = atRoot ? out.data : nullptr;
  return I.submit(
      d, blocking,
      [self, in, dst](const backend::Op& o) { self->router().reduce(o, in.data, dst); },
      std::move(buffers));
}

std::shared_ptr<WorkState> doGather(CommunicatorImpl& I, Tensor in, Tensor out, int root,
                                    bool blocking) {
  const char* name = "gather";
  I.checkUsable(name);
  I.validateTensor(name, "in", in);
  opcheck::checkRoot(I, name, root);
  const bool atRoot = I.commRank() == root;
  const bool same = atRoot && checkRootBlocks(I, name, {in, "in"}, {out, "out"}, root);
  OpDesc d{OpKind::kGather, in.dtype, ReduceOp::kSum, Algorithm::kAuto, root, in.count};
  CommunicatorImpl* self = &I;
  auto buffers = bindRooted(I, name, atRoot, {in, Buffers::kIn}, {out, Buffers::kOut}, same);
  void* dst = atRoot ? out.data : nullptr;
  return I.submit(
      d, blocking,
      [self, in, dst](const backend::Op& o) { self->router().gather(o, in.data, dst); },
      std::move(buffers));
}

std::shared_ptr<WorkState> doScatter(CommunicatorImpl& I, Tensor in, Tensor out, int root,
                                     bool blocking) {
  const char* name = "scatter";
  I.checkUsable(name);
  I.validateTensor(name, "out", out);
  opcheck::checkRoot(I, name, root);
  const bool atRoot = I.commRank() == root;
  const bool same = atRoot && checkRootBlocks(I, name, {out, "out"}, {in, "in"}, root);
  OpDesc d{OpKind::kScatter, out.dtype, ReduceOp::kSum, Algorithm::kAuto, root, out.count};
  CommunicatorImpl* self = &I;
  auto buffers = bindRooted(I, name, atRoot, {out, Buffers::kOut}, {in, Buffers::kIn}, same);
  const void* src = atRoot ? in.data : nullptr;
  return I.submit(
      d, blocking,
      [self, src, out](const backend::Op& o) { self->router().scatter(o, src, out.data); },
      std::move(buffers));
}

std::shared_ptr<WorkState> doAlltoall(CommunicatorImpl& I, Tensor in, Tensor out, bool blocking) {
  const char* name = "alltoall";
  I.checkUsable(name);
  I.validateTensor(name, "in", in);
  I.validateTensor(name, "out", out);
  const size_t n = static_cast<size_t>(I.commSize());
  if (in.count != out.count || in.dtype != out.dtype) {
    I.invalid(name, "out (" + std::to_string(out.count) + " x " + toString(out.dtype) +
                        ") must match in (" + std::to_string(in.count) + " x " +
                        toString(in.dtype) + ")");
  }
  if (in.count % n != 0) {
    I.invalid(name, "in.count (" + std::to_string(in.count) +
                        ") must be a multiple of the world size (" + std::to_string(n) + ")");
  }
  if (overlap(in.data, in.nbytes(), out.data, out.nbytes())) {
    I.invalid(name, "in and out must not overlap");
  }
  OpDesc d{OpKind::kAlltoall, in.dtype, ReduceOp::kSum, Algorithm::kAuto, 0, in.count / n};
  CommunicatorImpl* self = &I;
  auto buffers = Buffers::bind(I.binding(name), {{in, Buffers::kIn}, {out, Buffers::kOut}});
  return I.submit(
      d, blocking,
      [self, in, out](const backend::Op& o) { self->router().alltoall(o, in.data, out.data); },
      std::move(buffers));
}

}  // namespace

void Communicator::reduce(Tensor in, Tensor out, int root, ReduceOp op) {
  opcheck::finish(doReduce(impl(*this), in, out, op, root, true));
}
void Communicator::reduce(Tensor inout, int root, ReduceOp op) {
  opcheck::finish(doReduce(impl(*this), inout, inout, op, root, true));
}
void Communicator::gather(Tensor in, Tensor out, int root) {
  opcheck::finish(doGather(impl(*this), in, out, root, true));
}
void Communicator::scatter(Tensor in, Tensor out, int root) {
  opcheck::finish(doScatter(impl(*this), in, out, root, true));
}
void Communicator::alltoall(Tensor in, Tensor out) {
  opcheck::finish(doAlltoall(impl(*this), in, out, true));
}

Work Communicator::reduceAsync(Tensor in, Tensor out, int root, ReduceOp op) {
  return Work(doReduce(impl(*this), in, out, op, root, false));
}
Work Communicator::reduceAsync(Tensor inout, int root, ReduceOp op) {
  return Work(doReduce(impl(*this), inout, inout, op, root, false));
}
Work Communicator::gatherAsync(Tensor in, Tensor out, int root) {
  return Work(doGather(impl(*this), in, out, root, false));
}
Work Communicator::scatterAsync(Tensor in, Tensor out, int root) {
  return Work(doScatter(impl(*this), in, out, root, false));
}
Work Communicator::alltoallAsync(Tensor in, Tensor out) {
  return Work(doAlltoall(impl(*this), in, out, false));
}

}  // namespace gflow
