#include "kernels/cuda_kernels.h"

#include <cstring>

#include "common/check.h"
#include "cuda/device_guard.h"

namespace gflow::kernels {

CudaKernels::CudaKernels(const gflow::cuda::Plugin& plugin, int device, void* stream,
                         size_t maxTensors)
    : p_(plugin), device_(device), stream_(stream), maxSegments_(std::max<size_t>(1, maxTensors)) {
  gflow::cuda::DeviceGuard c(p_, device_);
  const size_t table = maxSegments_ * sizeof(cuda::CopySegment);
  check(p_.hostAlloc(&segmentsHost_, table), "allocating the pinned copy table");
  segmentsDevice_ = allocate(table);
  flagDevice_ = static_cast<int*>(allocate(sizeof(int)));
  void* h = nullptr;
  check(p_.hostAlloc(&h, sizeof(int)), "allocating the pinned inf/NaN flag");
  flagHost_ = static_cast<int*>(h);
  check(p_.eventCreate(&done_), "creating an event");
}

// Waits for our last work through the event, not the stream: a caller may
// destroy its stream once its ops are done, long before the communicator
// (the work it held still runs to completion, and the event with it).
CudaKernels::~CudaKernels() {
  gflow::cuda::DeviceGuard c(p_, device_);
  if (done_) {
    p_.eventSynchronize(done_);
    p_.eventDestroy(done_);
  }
  for (void* q : owned_) p_.deviceFree(q);
  for (const Block& b : blocks_) p_.deviceFree(b.p);
  if (segmentsHost_) p_.hostFree(segmentsHost_);
  if (flagHost_) p_.hostFree(flagHost_);
}

void CudaKernels::launched() {
  check(p_.eventRecord(done_, stream_), "recording an event after a kernel");
}

void CudaKernels::check(int err, const char* what) const {
  if (err == 0) return;
  GFLOW_THROW(kInternal, ErrorContext{})
      << "CUDA failed on cuda:" << device_ << " while " << what << ": " << p_.errorString(err);
}

void* CudaKernels::allocate(size_t bytes) {
  gflow::cuda::DeviceGuard c(p_, device_);
  void* q = nullptr;
  check(p_.deviceAlloc(&q, std::max<size_t>(bytes, 1)), "allocating gradient memory");
  owned_.push_back(q);
  zero(q, bytes);
  return q;
}

void CudaKernels::zero(void* p, size_t bytes) {
  if (bytes == 0) return;
  gflow::cuda::DeviceGuard c(p_, device_);
  const std::vector<char> zeros(bytes, 0);
  check(p_.memcpyAsync(p, zeros.data(), bytes, stream_), "zeroing gradient memory");
  check(p_.streamSynchronize(stream_), "zeroing gradient memory");
}

void* CudaKernels::acquire(size_t bytes) {
  bytes = std::max<size_t>(bytes, 256);
  std::lock_guard<std::mutex> lock(blocksMutex_);
  for (Block& b : blocks_) {
    if (!b.busy && b.bytes >= bytes) {
      b.busy = true;
      return b.p;
    }
  }
  gflow::cuda::DeviceGuard c(p_, device_);
  void* q = nullptr;
  check(p_.deviceAlloc(&q, bytes), "allocating gradient scratch memory");
  blocks_.push_back(Block{q, bytes, true});
  return q;
}

void CudaKernels::release(void* block) {
  std::lock_guard<std::mutex> lock(blocksMutex_);
  for (Block& b : blocks_) {
    if (b.p == block) b.busy = false;
  }
}

void CudaKernels::copy(const std::vector<Copy>& copies) {
  if (copies.empty()) return;
  gflow::cuda::DeviceGuard c(p_, device_);
  // The pinned table is read by the stream: the previous copy must be past it.
  check(p_.streamSynchronize(stream_), "waiting for the previous copy");
  if (copies.size() > maxSegments_) {  // a bigger batch than any before
    const size_t table = copies.size() * sizeof(cuda::CopySegment);
    void* host = nullptr;
    check(p_.hostAlloc(&host, table), "allocating the pinned copy table");
    p_.hostFree(segmentsHost_);
    segmentsHost_ = host;
    segmentsDevice_ = allocate(table);  // the old one stays with owned_
    maxSegments_ = copies.size();
  }
  auto* seg = static_cast<cuda::CopySegment*>(segmentsHost_);
  for (size_t i = 0; i < copies.size(); ++i) {
    seg[i] = cuda::CopySegment{copies[i].src, copies[i].dst, copies[i].bytes};
  }
  check(p_.batchedCopy(seg, copies.size(), segmentsDevice_, stream_), "launching a fusion copy");
  launched();
}

void CudaKernels::narrow(void* dst, const float* src, size_t count, DataType wire, float scale,
                         float* residual) {
  gflow::cuda::DeviceGuard c(p_, device_);
  check(p_.narrow(dst, src, count, {wire, scale}, residual, stream_),
        "launching the narrowing kernel");
  launched();
}

void CudaKernels::widen(float* dst, const void* src, size_t count, DataType wire, float scale) {
  gflow::cuda::DeviceGuard c(p_, device_);
  check(p_.widen(dst, src, count, {wire, scale}, stream_), "launching the widening kernel");
  launched();
}

void CudaKernels::scale(float* data, size_t count, float k) {
  gflow::cuda::DeviceGuard c(p_, device_);
  check(p_.scale(data, count, k, stream_), "launching the scaling kernel");
  launched();
}

bool CudaKernels::nonFinite(const void* data, size_t count, DataType dtype) {
  gflow::cuda::DeviceGuard c(p_, device_);
  *flagHost_ = 0;
  check(p_.memcpyAsync(flagDevice_, flagHost_, sizeof(int), stream_), "clearing the inf/NaN flag");
  check(p_.flagNonFinite(data, count, dtype, flagDevice_, stream_), "launching the inf/NaN scan");
  check(p_.memcpyAsync(flagHost_, flagDevice_, sizeof(int), stream_), "reading the inf/NaN flag");
  check(p_.streamSynchronize(stream_), "reading the inf/NaN flag");
  return *flagHost_ != 0;
}

namespace {

// The batched copies between a sparse bucket's pieces and its staging.
std::vector<GradientKernels::Copy> stagingCopies(const GradientKernels::SparseBucket& b,
                                                 bool toStaging) {
  std::vector<GradientKernels::Copy> c;
  for (const auto& p : b.pieces) {
    if (p.count == 0) continue;
    auto add = [&](float* piece, float* staged) {
      const size_t bytes = p.count * sizeof(float);
      if (toStaging) {
        c.push_back({piece, staged + p.at, bytes});
      } else {
        c.push_back({staged + p.at, piece, bytes});
      }
    };
    add(p.g, b.staged.g);
    add(p.v, b.staged.v);
    if (p.u) add(p.u, b.staged.u);
  }
  return c;
}

// The bucket's staged residual as the kernels take it, with velocity `u`.
gflow::kernels::cuda::ChunkedResidual residualOf(const GradientKernels::SparseBucket& b, float* u) {
  return {b.staged.v, u, b.n, b.chunk};
}

}  // namespace

void CudaKernels::accumulateChunkNorms(SparseBucket& b, float m, float* norms) {
  copy(stagingCopies(b, true));
  gflow::cuda::DeviceGuard c(p_, device_);
  check(p_.accumulateChunkNorms(residualOf(b, b.staged.u), b.staged.g, m, norms, stream_),
        "launching the CSC residual update");
  launched();
}

size_t CudaKernels::topChunksTempBytes(size_t count) const {
  return p_.topChunksTempBytes(count);
}

void CudaKernels::topChunks(const float* norms, size_t count, size_t k, uint32_t* idx, void* temp,
                            size_t tempBytes) {
  gflow::cuda::DeviceGuard c(p_, device_);
  check(p_.topChunks(norms, count, k, idx, {temp, tempBytes}, stream_),
        "launching the CSC chunk selection");
  launched();
}

void CudaKernels::gatherChunks(float* packed, const SparseBucket& b, const uint32_t* idx,
                               size_t k) {
  gflow::cuda::DeviceGuard c(p_, device_);
  check(p_.gatherChunks(packed, residualOf(b, nullptr), {idx, k}, stream_),
        "launching the CSC gather");
  launched();
}

void CudaKernels::scatterChunks(SparseBucket& b, const float* packed, const uint32_t* idx, size_t k,
                                bool maskVelocity) {
  {
    gflow::cuda::DeviceGuard c(p_, device_);
    float* u = maskVelocity ? b.staged.u : nullptr;
    check(p_.scatterChunks(b.staged.g, residualOf(b, u), packed, {idx, k}, stream_),
          "launching the CSC scatter");
    launched();
  }
  copy(stagingCopies(b, false));
}

void CudaKernels::toHost(const std::vector<Copy>& copies) {
  gflow::cuda::DeviceGuard c(p_, device_);
  for (const Copy& k : copies) {
    if (k.bytes == 0) continue;
    check(p_.memcpyAsync(k.dst, k.src, k.bytes, stream_), "copying gradient memory to the host");
  }
  check(p_.streamSynchronize(stream_), "copying gradient memory to the host");
}

void CudaKernels::synchronize() {
  gflow::cuda::DeviceGuard c(p_, device_);
  check(p_.streamSynchronize(stream_), "waiting for the gradients' stream");
}

}  // namespace gflow::kernels
