// The collective check at GradientReducer creation: every rank registered
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

// "tensor 3 ('fc.bias', 1000 x float32)".
std::string describeTensor(size_t index, const std::vector<Tensor>& tensors,
                           const std::vector<std::string>& names);

}  // namespace gflow::gradient
