// The communicator's side of the NCCL backend: choosing NCCL or staging for
// each op on device tensors, the cross-rank check of NCCL ops, and split.
#include "backend/nccl/nccl_backend.h"
#include "common/check.h"
#include "core/communicator_impl.h"

namespace gflow {

using backend::Algorithm;
using backend::OpDesc;
using backend::OpKind;

void Communicator::Impl::abortBackends(const Error& e) {
  if (backend) backend->abort(e);
  if (nccl) nccl->abort(e);
}

bool Communicator::Impl::onNccl(backend::Op& op, const DeviceStaging& st) {
  int device = -1;
  void* stream = nullptr;
  const bool single = st.single(&device, &stream);
  if (!nccl->use(op, *cudaPlugin.load(), device) || !single) return false;
  if (device != nccl->device()) {
    GFLOW_THROW(kInvalidArgument, (ErrorContext{"", op.seq, rank, -1}))
        << "this communicator runs NCCL on cuda:" << nccl->device()
        << ", but this op's tensors are on cuda:" << device
        << " (NCCL binds a communicator to one GPU: use another communicator for this GPU, or "
           "GFLOW_DEVICE_BACKEND=staged)";
  }
  op.stream = stream;
  if (ncclVerify && size > 1) {
    // A tiny allgather over the host backend whose envelope carries this
    // op's fingerprint: ranks that call another op, or stage this one,
    // fail with a mismatch naming both instead of hanging inside NCCL.
    OpDesc v{OpKind::kAllgather, DataType::kInt64, ReduceOp::kSum, Algorithm::kAuto, 0, 1};
    v.algo = selector->select(OpKind::kAllgather, sizeof(int64_t) * size, size);
    v.parent = backend::fingerprint(op.desc);
    const backend::Op check{op.seq, v, op.deadline};
    const int64_t mine = static_cast<int64_t>(v.parent);
    std::vector<int64_t> all(static_cast<size_t>(size));
    backend->allgather(check, &mine, all.data());
  }
  return true;
}

void Communicator::Impl::splitNccl(int color, int key, Impl* child) {
  // On the executing thread, after every earlier op: whether NCCL runs this
  // communicator is known there, and the same on every rank.
  auto task = [this, color, key, child] {
    if (auto e = error()) throw *e;
    const backend::Op op{seq, OpDesc{}, Deadline::after(timeout)};
    try {
      nccl->splitInto(op, color, key, child ? child->nccl.get() : nullptr);
    } catch (const Error& e) {
      Error full = e.withContext(ErrorContext{"split", seq, rank, e.peer()});
      fail(full);
      throw full;
    }
  };
  engine.submit(std::move(task), true)->wait(std::chrono::milliseconds(0));
}

}  // namespace gflow
