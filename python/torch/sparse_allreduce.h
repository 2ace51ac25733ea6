// Sparse allreduce for the torch backend, as Gloo does it: every rank's
// indices and values are gathered, and each rank builds the one coalesced
// sum of all of them.
#pragma once

#include <ATen/ATen.h>

#include <functional>
#include <vector>

#include "gflow/gflow.h"

namespace gflow::torch_backend {

struct SparseAllreduce {
  gflow::Work work;             // the gathering of indices and values
  std::function<void()> after;  // then: the sum, copied into the input tensor
  at::Tensor gathered;          // kept alive until `after` has run
};

// Starts the sum of the sparse COO tensor `t` over every rank of `comm`
// (blocking for the small exchange of shapes, then one asynchronous
// allgather). Every rank's `t` must have the same sizes, sparse and dense
// dimensions and dtype: otherwise invalid_argument, raised alike on every
// rank (each sees every rank's shape).
SparseAllreduce startSparseAllreduce(Communicator& comm, const at::Tensor& t);

}  // namespace gflow::torch_backend
