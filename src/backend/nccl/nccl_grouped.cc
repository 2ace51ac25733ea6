// The NCCL backend's ops that NCCL has no collective for: gather, scatter,
// all-to-all and their uneven forms, each one NCCL group of
// ncclSend/ncclRecv of bytes (docs/backends.md, "NCCL"). Every block goes
// straight from its owner to its destination; NCCL progresses the group's
// transfers together, so no ordering of the pairs can deadlock.
#include <algorithm>

#include "backend/device_buffers.h"
#include "backend/nccl/nccl_backend.h"
#include "cuda/device_guard.h"

namespace gflow::backend {
namespace {

const char* at(const void* base, uint64_t elements, size_t elementSize) {
  return static_cast<const char*>(base) + elements * elementSize;
}

}  // namespace

void NcclBackend::exchange(const Op& op, std::vector<Transfer> sends, std::vector<Transfer> recvs,
                           const char* what, const CheckedCounts& counts) {
  // This rank's own block, already where it belongs (in place): no copy.
  auto self = [&](const Transfer& t) { return t.peer == s_.rank; };
  const auto sendSelf = std::find_if(sends.begin(), sends.end(), self);
  const auto recvSelf = std::find_if(recvs.begin(), recvs.end(), self);
  if (sendSelf != sends.end() && recvSelf != recvs.end() && sendSelf->data == recvSelf->data) {
    sends.erase(sendSelf);
    recvs.erase(recvSelf);
  }
  cuda::DeviceGuard g(*plugin_, device_);
  enqueueGroup(op, sends, recvs);
  finish(op, what, counts);
}

void NcclBackend::enqueueGroup(const Op& op, const std::vector<Transfer>& sends,
                               const std::vector<Transfer>& recvs) {
  begin(op);
  const int bytes = static_cast<int>(DataType::kUInt8);
  int first = api_->groupStart();
  const char* failed = "ncclGroupStart";
  auto call = [&](int r, const char* name) {
    if (first == nccl::kSuccess && r != nccl::kSuccess) {
      first = r;
      failed = name;
    }
  };
  if (first == nccl::kSuccess) {
    for (const Transfer& t : sends) {
      if (t.bytes > 0) call(api_->send(t.data, t.bytes, bytes, t.peer, comm_, stream_), "ncclSend");
    }
    for (const Transfer& t : recvs) {
      if (t.bytes > 0) {
        call(api_->recv(const_cast<void*>(t.data), t.bytes, bytes, t.peer, comm_, stream_),
             "ncclRecv");
      }
    }
    // Always closed, even after a failed call: NCCL's groups must balance.
    const int end = api_->groupEnd();
    if (first == nccl::kSuccess) {
      first = end;
      failed = "ncclGroupEnd";
    }
  }
  check(op, comm_, failed, first);
}

NcclBackend::DeviceCopy::~DeviceCopy() {
  if (mem) plugin->deviceFree(mem);
}

void* NcclBackend::rootBuffer(const Op& op, const void* p, size_t bytes, bool input,
                              DeviceCopy* copy) {
  int device = -1;
  void* ready = nullptr;
  if (!p || bytes == 0 || op.buffers->single(&device, &ready)) return const_cast<void*>(p);
  copy->plugin = plugin_;
  if (int e = plugin_->deviceAlloc(&copy->mem, bytes)) {
    failCuda(op, e, "allocating a device copy of the root's buffer");
  }
  if (!input) return copy->mem;
  if (void* produced = op.buffers->eventOf(p)) {
    if (int e = plugin_->streamWaitEvent(stream_, produced)) {
      failCuda(op, e, "making the NCCL stream wait for the root's buffer");
    }
  }
  if (int e = plugin_->memcpyAsync(copy->mem, p, bytes, stream_)) {
    failCuda(op, e, "copying the root's buffer to the GPU");
  }
  return copy->mem;
}

void NcclBackend::copyBack(const Op& op, void* p, size_t bytes, const DeviceCopy& copy) {
  if (!copy.mem) return;
  if (int e = plugin_->memcpyAsync(p, copy.mem, bytes, stream_)) {
    failCuda(op, e, "copying the result to the root's buffer");
  }
  if (int e = plugin_->streamSynchronize(stream_)) {
    failCuda(op, e, "copying the result to the root's buffer");
  }
}

// Equal blocks: the uneven forms with Blocks::equal, as alltoall below.
void NcclBackend::gather(const Op& op, const void* in, void* out) {
  gatherv(op, in, out, Blocks::equal(s_.size, op.desc.count));
}

void NcclBackend::scatter(const Op& op, const void* in, void* out) {
  scatterv(op, in, Blocks::equal(s_.size, op.desc.count), out);
}

void NcclBackend::alltoall(const Op& op, const void* in, void* out) {
  const Blocks b = Blocks::equal(s_.size, op.desc.count);
  alltoallv(op, in, b, out, b);
}

void NcclBackend::alltoallv(const Op& op, const void* in, const Blocks& inBlocks, void* out,
                            const Blocks& outBlocks) {
  const size_t es = dataTypeSize(op.desc.dtype);
  std::vector<Transfer> sends, recvs;
  // Staggered by rank, as the host's pairwise exchange: rank r's first
  // transfer goes to r + 1, so no peer receives from everyone at once.
  for (int i = 0; i < s_.size; ++i) {
    const int to = (s_.rank + i) % s_.size, from = (s_.rank - i + s_.size) % s_.size;
    sends.push_back({to, at(in, inBlocks.offsets[to], es), inBlocks.counts[to] * es});
    recvs.push_back({from, at(out, outBlocks.offsets[from], es), outBlocks.counts[from] * es});
  }
  const char* what = op.desc.kind == OpKind::kAlltoall ? "all-to-all (grouped ncclSend/ncclRecv)"
                     : op.desc.kind == OpKind::kAllgatherv
                         ? "allgatherv (grouped ncclSend/ncclRecv)"
                         : "alltoallv (grouped ncclSend/ncclRecv)";
  // The uneven forms' counts differ by rank: the check compares them.
  const CheckedCounts counts =
      op.desc.kind == OpKind::kAlltoall ? CheckedCounts{} : CheckedCounts{&inBlocks, &outBlocks};
  exchange(op, std::move(sends), std::move(recvs), what, counts);
}

void NcclBackend::gatherv(const Op& op, const void* in, void* out, const Blocks& blocks) {
  const size_t es = dataTypeSize(op.desc.dtype);
  cuda::DeviceGuard g(*plugin_, device_);
  DeviceCopy copy;
  std::vector<Transfer> recvs;
  if (s_.rank == op.desc.root) {
    void* dst = rootBuffer(op, out, blocks.total() * es, false, &copy);
    for (int r = 0; r < s_.size; ++r) {
      recvs.push_back({r, at(dst, blocks.offsets[r], es), blocks.counts[r] * es});
    }
  }
  exchange(op, {{op.desc.root, in, blocks.counts[s_.rank] * es}}, std::move(recvs),
           op.desc.kind == OpKind::kGather ? "gather (grouped ncclSend/ncclRecv)"
                                           : "gatherv (grouped ncclSend/ncclRecv)");
  copyBack(op, out, blocks.total() * es, copy);
}

void NcclBackend::scatterv(const Op& op, const void* in, const Blocks& blocks, void* out) {
  const size_t es = dataTypeSize(op.desc.dtype);
  cuda::DeviceGuard g(*plugin_, device_);
  DeviceCopy copy;
  std::vector<Transfer> sends;
  if (s_.rank == op.desc.root) {
    const void* src = rootBuffer(op, in, blocks.total() * es, true, &copy);
    for (int r = 0; r < s_.size; ++r) {
      sends.push_back({r, at(src, blocks.offsets[r], es), blocks.counts[r] * es});
    }
  }
  exchange(op, std::move(sends), {{op.desc.root, out, blocks.counts[s_.rank] * es}},
           op.desc.kind == OpKind::kScatter ? "scatter (grouped ncclSend/ncclRecv)"
                                            : "scatterv (grouped ncclSend/ncclRecv)");
}

}  // namespace gflow::backend
