// The gflow public API in one include.
//
//   auto comm = gflow::init();               // from GFLOW_* / torchrun / MPI / Slurm
//   gflow::allreduce(gflow::tensor(grad.data(), grad.size()), gflow::ReduceOp::kAvg);
#pragma once

#include <memory>

#include "gflow/communicator.h"
#include "gflow/error.h"
#include "gflow/options.h"
#include "gflow/process.h"
#include "gflow/reducer.h"
#include "gflow/store.h"
#include "gflow/types.h"
#include "gflow/version.h"

namespace gflow {

// Creates the process's default (world) communicator; collective over every
// rank. Calling it again returns the existing one.
GFLOW_EXPORT std::shared_ptr<Communicator> init(const Options& options = Options{});
// The default communicator; throws Error(kInvalidArgument) before init().
GFLOW_EXPORT std::shared_ptr<Communicator> defaultCommunicator();
// Drops the default communicator (it is destroyed once no one holds it).
GFLOW_EXPORT void finalize();

// Collectives on the default communicator.
GFLOW_EXPORT void allreduce(Tensor inout, ReduceOp op = ReduceOp::kSum);
GFLOW_EXPORT Work allreduceAsync(Tensor inout, ReduceOp op = ReduceOp::kSum);

}  // namespace gflow
