// allreduceCoalesced (include/gflow/reducer.h): one-shot fusion of a list
// of tensors into buffers of up to the threshold, reduced through the same
// Fuser as GradientReducer's buckets.
#include <memory>
#include <string>
#include <vector>

#include "core/internal.h"
#include "gflow/reducer.h"
#include "gradient/bucket_plan.h"
#include "gradient/fuser.h"
#include "gradient/registration.h"
#include "gradient/tensor_device.h"

namespace gflow {

using gradient::Bucket;
using gradient::BucketPlan;
using gradient::Fuser;
using internal::CommunicatorAccess;

Work allreduceCoalesced(Communicator& comm, const std::vector<Tensor>& tensors, ReduceOp op,
                        uint64_t fusionThreshold) {
  const char* kOp = "allreduce_coalesced";
  gradient::validateTensors(comm, kOp, tensors, {});
  // What the ops read, owned by them until the last one has run.
  struct Batch {
    std::vector<Tensor> tensors;
    std::vector<std::string> names;
    // Cuda tensors: the communicator's kernels for this GPU and stream
    // (kept with the communicator, so no op frees device memory) and the
    // fusion regions taken from them, handed back with the batch.
    std::shared_ptr<kernels::GradientKernels> device;
    std::vector<std::vector<char>> buffers;
    std::vector<char*> regions;
    ~Batch() {
      if (!device) return;
      for (char* r : regions) device->release(r);
    }
  };
  auto batch = std::make_shared<Batch>();
  batch->tensors = tensors;
  std::string why;
  const int device = gradient::commonDevice(nullptr, tensors, {}, &why);
  if (device >= 0) {
    batch->device =
        CommunicatorAccess::kernelsFor(comm, Device{DeviceType::kCUDA, device}, tensors[0].stream);
  }
  const BucketPlan plan =
      gradient::planBuckets(tensors, gradient::thresholdOr(comm, kOp, fusionThreshold));
  batch->buffers.reserve(plan.buckets.size());
  for (const Bucket& b : plan.buckets) {
    const size_t bytes = b.inPlace ? 0 : b.bytes;
    batch->buffers.emplace_back(batch->device ? 0 : bytes);
    batch->regions.push_back(batch->device ? static_cast<char*>(batch->device->acquire(bytes))
                                           : batch->buffers.back().data());
  }
  gradient::FuserConfig fc;
  fc.comm = &comm;
  fc.tensors = &batch->tensors;
  fc.names = &batch->names;
  fc.op = op;
  fc.kernels = batch->device;
  Fuser fuser(std::move(fc));
  std::shared_ptr<WorkState> last;
  for (size_t k = 0; k < plan.buckets.size(); ++k) {
    gradient::FireOptions o;
    o.owner = batch;
    last = fuser.fire(plan.buckets[k], batch->regions[k], std::move(o)).works.back();
  }
  // Ops run in issue order and the first failure fails every later one, so
  // the last op's completion is the batch's.
  return last ? Work(last) : Work();
}

}  // namespace gflow
