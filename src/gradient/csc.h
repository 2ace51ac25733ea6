// Coarse-grained sparse communication (CSC, GradientFlow): a float32 bucket
// is cut into chunks of C elements; every rank adds its gradient to its
// local residual (error feedback; with momentum correction it adds its
// velocity instead, as in Deep Gradient Compression), computes each chunk's
// L1 norm, and the norms are allreduced; every rank then picks the same top
// fraction of chunks (ties by index) with no further negotiation, and only
// those travel (float32 or the wire type). The gradient comes back with the
// reduced picked chunks and zeros elsewhere; the other chunks stay in the
// residual for the next step. Written over the communicator and the kernels
// (kernels::GradientKernels), so host and cuda tensors share the protocol.
// The host kernels work in place in the tensors and the residual; the CUDA
// kernels stage the bucket contiguously (one batched copy in, one out).
#pragma once

#include <atomic>
#include <functional>
#include <memory>
#include <string>
#include <vector>

#include "core/internal.h"
#include "gflow/communicator.h"
#include "gflow/reducer.h"
#include "gradient/bucket_plan.h"
#include "gradient/fuser.h"
#include "gradient/timeline.h"
#include "kernels/gradient_kernels.h"

namespace gflow::gradient {

struct CscConfig {
  double density = 0.1;      // fraction of chunks sent, (0, 1]
  size_t chunk = 1024;       // elements per chunk
  float momentum = 0.0f;     // > 0: momentum correction (velocity per element)
  uint64_t warmupSteps = 0;  // the first steps send every chunk
};

// SparseOptions with the GFLOW_CSC_* defaults filled in and checked (bad
// values fail `comm`, as registration.h's checks do).
CscConfig cscConfig(Communicator& comm, const SparseOptions& options);

class Csc {
 public:
  // Residual (and velocity) storage for every float32 tensor of `tensors`,
  // in the memory of `kernels` (null: host memory), where the steps run.
  Csc(const std::vector<Tensor>& tensors, CscConfig config,
      std::shared_ptr<kernels::GradientKernels> kernels = nullptr);

  // Chunks sent per bucket of `n` elements cut in `chunk`s at `step`.
  size_t picked(size_t n, size_t chunk, uint64_t step) const;
  // Drops the residual and velocity: after a step whose result held inf or
  // NaN (every rank agrees on it), so they carry neither into later steps
  // nor the loss scale the step was computed at.
  void reset();
  // The residual and velocity of `from`, a Csc of the same tensors and
  // config (GradientReducer::rebuild).
  void carryFrom(const Csc& from);
  const CscConfig& config() const { return config_; }

  // Two ops on `comm`: the allreduce (sum) of the bucket's chunk norms, then
  // the allreduce (`op`, on the wire type) of its picked chunks. The bucket
  // is never packed: chunks are cut over the bucket's tensors in order and
  // read and written in place in the residual.
  // What the reducer passes along with a bucket.
  struct Fire {
    ReduceOp op = ReduceOp::kSum;
    internal::WireFormat wire;
    uint64_t step = 0;
    ReducerStats* stats = nullptr;                 // null: not counted
    Timeline* timeline = nullptr;                  // null: not traced
    std::string label;                             // the bucket's name in the timeline
    std::shared_ptr<const void> owner;             // kept alive until both ops complete
    std::shared_ptr<std::atomic<bool>> nonFinite;  // set when the result holds inf or NaN
  };
  std::vector<std::shared_ptr<WorkState>> fire(Communicator& comm, const Bucket& b, Fire f);

 private:
  struct Job;
  std::shared_ptr<Job> makeJob(const Bucket& b, const internal::WireFormat& wire,
                               uint64_t step) const;
  // The second op's steps: the picked chunks (on the wire type).
  internal::FusedSteps valuesSteps(const std::shared_ptr<Job>& job, Communicator& comm, ReduceOp op,
                                   const internal::WireFormat& wire,
                                   std::shared_ptr<std::atomic<bool>> nonFinite) const;
  // Submits the second op (the picked values) after the norms op in
  // works->front(); when that fails, waits for the first before rethrowing.
  static void submitValues(Communicator& comm, const Tensor& values, ReduceOp op,
                           std::function<void()> before, std::function<void()> after,
                           std::vector<std::shared_ptr<WorkState>>* works);

  const std::vector<Tensor>& tensors_;
  CscConfig config_;
  std::shared_ptr<kernels::GradientKernels>
      kernels_;                 // shared with the jobs, which may outlive this
  std::vector<size_t> offset_;  // per tensor: start in residual_/velocity_
  float* residual_ = nullptr;   // error feedback (kernels_' memory)
  float* velocity_ = nullptr;   // momentum correction
  size_t total_ = 0;            // float32 elements of all tensors
};

}  // namespace gflow::gradient
