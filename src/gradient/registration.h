// The checks at GradientReducer creation. The collective one: every rank registered
// the same tensors (count and dtype, in order) with the same options.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "gflow/communicator.h"

namespace gflow::gradient {

struct RegistrationOptions {
  ReduceOp op = ReduceOp::kAvg;
  uint64_t threshold = 0;
  int64_t cycleMs = 0;
  int64_t compression = 0;  // digest of the wire, CSC and reproducible settings
};

// Collective over `comm` (one allgather; a second one on a mismatch to find
// the first differing tensor). Throws Error(kMismatch) on every rank, naming
// the first tensor (with this rank's name for it) or option that differs and
// the ranks involved.
void checkRegistration(Communicator& comm, const std::vector<Tensor>& tensors,
                       const std::vector<std::string>& names, const RegistrationOptions& options);

// The checks of what a reducer or a coalesced batch is given, before any
// collective. Bad input on one rank fails the communicator
// (CommunicatorAccess::failInvalid, which throws), so the peers (already in,
// or about to enter, the op's collectives) get the error instead of waiting.
// The fusion threshold: `given`, or GFLOW_FUSION_THRESHOLD when 0.
uint64_t thresholdOr(Communicator& comm, const char* op, uint64_t given);
// Valid dtypes and devices, data behind every non-empty tensor, one GPU
// (and a loadable CUDA component) for cuda tensors, no overlaps.
void validateTensors(Communicator& comm, const char* op, const std::vector<Tensor>& tensors,
                     const std::vector<std::string>& names);

// "tensor 3 ('fc.bias', 1000 x float32)".
std::string describeTensor(size_t index, const std::vector<Tensor>& tensors,
                           const std::vector<std::string>& names);

}  // namespace gflow::gradient
