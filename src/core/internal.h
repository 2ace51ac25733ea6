// Library-internal entry points into a Communicator for the layers above
// core (src/gradient): composite ops that run extra work on the progress
// thread around a collective, the compressed allreduce they share with
// core, and failing a communicator from outside an op. The gradient layer
// reaches core only through this header.
#pragma once

#include <functional>
#include <memory>
#include <string>

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
  // Fails `comm` with kInvalidArgument for `op` (the peers get the same
  // error instead of waiting for this rank) and throws it.
  [[noreturn]] static void failInvalid(Communicator& comm, const char* op, const std::string& what);
  // Communicator::abort() with `error` instead of the generic one: pending
  // and later ops fail with it, and so do the peers'.
  static void abortWith(Communicator& comm, const Error& error);
  // State the gradient layer keeps per communicator under `key` (made by
  // `make` on first use), destroyed with the communicator after its last op:
  // device memory that ops use is never freed while ops run.
  static std::shared_ptr<void> cached(Communicator& comm, const std::string& key,
                                      const std::function<std::shared_ptr<void>()>& make);
};

}  // namespace gflow::internal
