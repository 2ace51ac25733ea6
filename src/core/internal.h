// Library-internal entry points into a Communicator for the layers above
// core (src/gradient): composite ops that run extra work on the progress
// thread around a collective, the compressed allreduce they share with
// core, the communicator's device kernels, and failing a communicator from
// outside an op. The gradient layer
// reaches core only through this header.
#pragma once

#include <functional>
#include <memory>
#include <string>
#include <vector>

#include "common/arrivals.h"
#include "core/compressed_allreduce.h"  // re-exported: the one compressed allreduce
#include "core/executor.h"              // re-exported: WorkState, what the ops hand back
#include "gflow/communicator.h"

namespace gflow {
class WorkState;  // core/executor.h
}  // namespace gflow

namespace gflow::internal {

struct CommunicatorAccess {
  // Allreduce of `buffer` in place as one op in the communicator's order:
  // on the progress thread, `before` runs just before the collective and
  // `after` just after it succeeded (either may be empty). An exception from
  // them fails the op like a transport error.
  static std::shared_ptr<WorkState> fusedAllreduce(Communicator& comm, Tensor buffer, ReduceOp op,
                                                   std::function<void()> before,
                                                   std::function<void()> after);
  // Whether `comm` runs its allreduces and reduce-scatters in reproducible
  // mode, and setting it (the gradient layer's own communicator, before its
  // first op: ReducerOptions::reproducible).
  static bool reproducible(const Communicator& comm);
  static void setReproducible(Communicator& comm, bool on);
  // Fails `comm` with kInvalidArgument for `op` (the peers get the same
  // error instead of waiting for this rank) and throws it.
  [[noreturn]] static void failInvalid(Communicator& comm, const char* op, const std::string& what);
  // Communicator::abort() with `error` instead of the generic one: pending
  // and later ops fail with it, and so do the peers'.
  static void abortWith(Communicator& comm, const Error& error);
  // The kernels for memory on `where` with work on `stream`: the host
  // kernels for host memory; for a GPU, the communicator's CudaKernels of
  // (GPU, stream), made on first use and destroyed with the communicator
  // after its last op, so device memory that ops use is never freed while
  // ops run. Thread-safe.
  static std::shared_ptr<kernels::GradientKernels> kernelsFor(Communicator& comm, Device where,
                                                              void* stream);
  // The straggler verdicts of the last Arrivals::kRecent collectives
  // (oldest first; common/arrivals.h). Thread-safe.
  static std::vector<ArrivalVerdict> arrivalVerdicts(const Communicator& comm);
  // The running op's straggler so far (Arrivals::current); the executing
  // thread, e.g. in fusedAllreduce's `after`.
  static ArrivalVerdict currentArrival(const Communicator& comm);
};

}  // namespace gflow::internal
