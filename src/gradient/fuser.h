// Fuser: fires one bucket as ops on the communicator's engine. Dense float32
// (or any dtype): pack -> allreduce -> unpack, or in place. Compressed
// (float32 gradients as float16/bfloat16 on the wire): pack and narrow ->
// allreduce on the wire type -> widen and unpack. Sparse (CSC, csc.h): two
// ops, chunk norms then the picked chunks. Shared by GradientReducer and
// allreduceCoalesced; the timeline spans of every phase are recorded here.
#pragma once

#include <atomic>
#include <memory>
#include <string>
#include <vector>

#include "core/engine.h"
#include "gflow/communicator.h"
#include "gflow/reducer.h"
#include "gradient/bucket_plan.h"
#include "gradient/timeline.h"

namespace gflow::gradient {

class Csc;
class DeviceOps;

// How float32 buckets travel.
struct WireOptions {
  DataType wire = DataType::kFloat32;  // kFloat16 / kBFloat16: compressed
  float prescale = 1.0f;
  float postscale = 1.0f;
  bool compressed() const { return wire != DataType::kFloat32; }
};

// What one fire() hands back to its caller.
struct Fired {
  std::vector<std::shared_ptr<WorkState>> works;
};

class Fuser {
 public:
  // `csc` (may be null) makes float32 buckets sparse. `device` (null for
  // cpu tensors): the tensors are cuda tensors, packed and converted by its
  // kernels into device regions.
  Fuser(Communicator& comm, const std::vector<Tensor>& tensors,
        const std::vector<std::string>& names, ReduceOp op, Timeline* timeline, WireOptions wire,
        Csc* csc, DeviceOps* device = nullptr);

  // Whether bucket b is packed into a region of b.bytes (not reduced in place).
  bool packs(const Bucket& b) const;
  // Fires bucket b. `region` holds b.bytes when packs(b). `owner` is kept
  // alive until the ops have run. `nonFinite` (may be null) is set when a
  // compressed or sparse result holds an inf or NaN. `step` counts the
  // caller's steps (timeline; CSC warm-up).
  Fired fire(const Bucket& b, char* region, uint64_t step, ReducerStats* stats,
             std::shared_ptr<const void> owner, std::shared_ptr<std::atomic<bool>> nonFinite);

 private:
  bool isFloat32(const Bucket& b) const { return b.dtype == DataType::kFloat32; }

  Communicator& comm_;
  const std::vector<Tensor>& tensors_;
  const std::vector<std::string>& names_;
  ReduceOp op_;
  Timeline* timeline_;
  WireOptions wire_;
  Csc* csc_;
  DeviceOps* device_;
};

// The timeline label of a bucket ("bucket of 7", a direct tensor's name).
std::string bucketLabel(const Bucket& b, const std::vector<std::string>& names);

}  // namespace gflow::gradient
