// Fuser: fires one bucket as ops on the communicator's engine. Dense float32
// (or any dtype): pack -> allreduce -> unpack, or in place. Compressed
// (float32 gradients as float16/bfloat16 on the wire): core's one compressed
// allreduce (core/compressed_allreduce.h) over the bucket's tensors. Sparse
// (CSC, csc.h): two ops, chunk norms then the picked chunks. Shared by
// GradientReducer and allreduceCoalesced; the element work runs on the
// kernels the config names (host or CUDA, chosen once by the owner), and
// the timeline spans of every phase are recorded here.
#pragma once

#include <atomic>
#include <functional>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "core/internal.h"
#include "gflow/communicator.h"
#include "gflow/reducer.h"
#include "gradient/bucket_plan.h"
#include "gradient/timeline.h"
#include "kernels/gradient_kernels.h"

namespace gflow::gradient {

class Csc;

// What one fire() hands back to its caller.
struct Fired {
  std::vector<std::shared_ptr<WorkState>> works;
};

// One fire()'s arguments beyond the bucket.
struct FireOptions {
  uint64_t step = 0;                  // the caller's steps (timeline; CSC warm-up)
  ReducerStats* stats = nullptr;      // may be null
  std::shared_ptr<const void> owner;  // kept alive until the ops have run
  // Set when a compressed or sparse result holds an inf or NaN (may be null).
  std::shared_ptr<std::atomic<bool>> nonFinite;
  // A float32 bucket's wire for this op (one of the config's `wires`);
  // unset: config's wire.wire.
  std::optional<DataType> wire;
  // Called on the executing thread with the TickClock ticks
  // (common/tick_clock.h) at which the op's run began and ended (before()
  // to after()).
  std::function<void(int64_t, int64_t)> timed;
};

// What a Fuser works with, by name. The referenced objects outlive the Fuser.
struct FuserConfig {
  Communicator* comm = nullptr;
  const std::vector<Tensor>* tensors = nullptr;
  const std::vector<std::string>* names = nullptr;  // timeline labels (may be empty)
  ReduceOp op = ReduceOp::kSum;
  Timeline* timeline = nullptr;  // may be null
  internal::WireFormat wire;     // how float32 buckets travel
  // Every wire a fire() may name (automatic wire); empty: wire.wire only.
  std::vector<DataType> wires;
  // Error feedback on a quantized wire: one residual per tensor (null: none).
  const std::vector<float*>* residuals = nullptr;
  Csc* csc = nullptr;  // not null: float32 buckets are sparse
  // Where the tensors live (null: host memory); regions are its memory too.
  std::shared_ptr<kernels::GradientKernels> kernels;
};

class Fuser {
 public:
  explicit Fuser(FuserConfig config);

  // Whether bucket b needs a region (is packed on some wire it may take).
  bool packs(const Bucket& b) const;
  // What a region needs beyond b.bytes: a quantized wire's blocks of a tiny
  // bucket take more than its float32 bytes (one block holds 128 values),
  // never more than b.bytes plus one block.
  uint64_t slack() const;
  // Fires bucket b. `region` holds b.bytes + slack() when packs(b).
  Fired fire(const Bucket& b, char* region, FireOptions options);

 private:
  bool isFloat32(const Bucket& b) const { return b.dtype == DataType::kFloat32; }
  // Whether b is packed on `wire` (compressed float32 always is).
  bool packsOn(const Bucket& b, DataType wire) const;
  // The op's buffer and its before/after element work, without the timeline.
  internal::FusedSteps compressedSteps(const Bucket& b, char* region, DataType wire,
                                       std::shared_ptr<std::atomic<bool>> nonFinite) const;
  internal::FusedSteps denseSteps(const Bucket& b, char* region) const;

  FuserConfig c_;
};

// The timeline label of a bucket ("bucket of 7", a direct tensor's name).
std::string bucketLabel(const Bucket& b, const std::vector<std::string>& names);

}  // namespace gflow::gradient
