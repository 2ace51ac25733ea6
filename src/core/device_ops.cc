// The communicator's side of device tensors: their validation, choosing NCCL or staging for
// each op on device tensors, the cross-rank check of NCCL ops, and split.
#include "backend/nccl/nccl_backend.h"
#include "common/check.h"
#include "core/communicator_impl.h"
#include "core/internal.h"
#include "kernels/cuda/plugin.h"

namespace gflow {
namespace {

// 64 bits of everything in an op's description that must agree.
uint64_t digest(const backend::OpDesc& d) {
  uint64_t h = 0xcbf29ce484222325ULL;
  for (uint64_t v : {uint64_t(d.kind), uint64_t(d.dtype), uint64_t(d.op), uint64_t(d.algo),
                     uint64_t(int64_t(d.root)), d.count}) {
    h = (h ^ v) * 0x100000001b3ULL;
    h ^= h >> 29;
  }
  return h;
}

}  // namespace

using backend::Algorithm;
using backend::OpDesc;
using backend::OpKind;

void Communicator::Impl::abortBackends(const Error& e) {
  if (backend) backend->abort(e);
  if (nccl) nccl->abort(e);
}

void Communicator::Impl::validateCudaTensor(const char* op, const char* name, const Tensor& t) {
  std::string why;
  const cuda::Plugin* p = cuda::load(&why);
  if (!p) invalid(op, std::string(name) + " is a cuda tensor, but " + why);
  int n = 0;
  p->deviceCount(&n);
  if (t.device.index < 0 || t.device.index >= n) {
    invalid(op, std::string(name) + " is on cuda:" + std::to_string(t.device.index) +
                    ", but this process sees " + std::to_string(n) + " GPU(s)");
  }
  int dev = -1;
  p->pointerDevice(t.data, &dev);
  if (t.count > 0 && dev != t.device.index) {
    invalid(op,
            std::string(name) + ".data is not memory of cuda:" + std::to_string(t.device.index) +
                " (it is " +
                (dev < 0 ? std::string("host memory") : "memory of cuda:" + std::to_string(dev)) +
                ")");
  }
  // cudaStreamPerThread names the calling thread's stream, which is not
  // the thread gflow works on.
  if (t.stream == reinterpret_cast<void*>(0x2)) {
    invalid(op, std::string(name) + ".stream is cudaStreamPerThread; pass the stream itself");
  }
  cudaPlugin.store(p);
}

bool Communicator::Impl::onNccl(backend::Op& op, const DeviceStaging& st) {
  int device = -1;
  void* ready = nullptr;
  const bool single = st.single(&device, &ready);
  if (!nccl->use(op, *cudaPlugin.load(), device) || !single) return false;
  if (device != nccl->device()) {
    GFLOW_THROW(kInvalidArgument, (ErrorContext{"", op.seq, rank, -1}))
        << "this communicator runs NCCL on cuda:" << nccl->device()
        << ", but this op's tensors are on cuda:" << device
        << " (NCCL binds a communicator to one GPU: use another communicator for this GPU, or "
           "GFLOW_DEVICE_BACKEND=staged)";
  }
  op.ready = ready;
  if (ncclVerify && size > 1) {
    // A tiny allgather over the host backend whose envelope carries this
    // op's fingerprint: ranks that call another op, or stage this one,
    // fail with a mismatch naming both instead of hanging inside NCCL.
    OpDesc v{OpKind::kAllgather, DataType::kInt64, ReduceOp::kSum, Algorithm::kAuto, 0, 1};
    v.algo = selector->select(OpKind::kAllgather, sizeof(int64_t) * size, size);
    v.parent = backend::fingerprint(op.desc);
    const backend::Op check{op.seq, v, op.deadline};
    // The envelope compares 24 bits; the values compare all 64 of a digest
    // of the whole description.
    const int64_t mine = static_cast<int64_t>(digest(op.desc));
    std::vector<int64_t> all(static_cast<size_t>(size));
    backend->allgather(check, &mine, all.data());
    for (int r = 0; r < size; ++r) {
      if (all[r] != mine) {
        GFLOW_THROW(kMismatch, (ErrorContext{"", op.seq, rank, r}))
            << "rank " << r << " called another op on NCCL than this rank ("
            << backend::describe(backend::encode(op.desc)) << ")";
      }
    }
  }
  return true;
}

std::shared_ptr<void> internal::CommunicatorAccess::cached(
    Communicator& comm, const std::string& key,
    const std::function<std::shared_ptr<void>()>& make) {
  Communicator::Impl& I = *comm.impl_;
  std::lock_guard<std::mutex> lock(I.cacheMutex);
  std::shared_ptr<void>& slot = I.cache[key];
  if (!slot) slot = make();
  return slot;
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
