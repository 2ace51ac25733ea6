// Algorithm selection, in one place: which algorithm runs an op of a given
// kind and size. Defaults are measured (docs/algorithms.md); GFLOW_ALGO or
// Options::algorithm override them with rules such as
//   "ring"                                   every allreduce uses ring
//   "allreduce:0-64k:rd,allreduce:64k-:ring" by message size (bytes)
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "backend/backend.h"

namespace gflow {

class AlgorithmSelector {
 public:
  // Throws Error(kInvalidArgument) naming `source` on a malformed spec.
  AlgorithmSelector(const std::string& spec, const std::string& source, uint64_t rdMaxBytes);

  backend::Algorithm select(backend::OpKind kind, uint64_t bytes, int worldSize) const;

  // The default recursive-doubling threshold for a world size (GFLOW_RD_MAX_BYTES=auto).
  static uint64_t defaultRdMaxBytes(int worldSize);

 private:
  struct Rule {
    backend::OpKind kind;
    uint64_t lo;
    uint64_t hi;  // exclusive; UINT64_MAX: no upper bound
    backend::Algorithm algo;
  };
  std::vector<Rule> rules_;
  uint64_t rdMaxBytes_;  // 0: per world size default
};

}  // namespace gflow
