// Verdict: how a communicator fails, and how its ranks come to fail alike
// (docs/errors.md, "One verdict"). A communicator's first failure is its
// error for good (sticky: every later call raises it); the peers hear of it
// once; a failure that blames another rank is settled among the survivors
// so that all raise the same error; and an op this rank will not run
// (rejected arguments) is announced so the peers that run it fail at once
// and the others go on.
//
// States and transitions ("executing": the thread that runs the ops; "any
// thread": abort(), a failed argument check outside an op):
//
// clang-format off
// state     event (function)                  action                                    next
// --------  --------------------------------  ----------------------------------------  --------
// healthy   an op fails, blaming no other     record it; abort the backends; report it  notified
//           rank (fail)                       to the peers
// healthy   an op fails, blaming rank q       abort; report it; await every peer's      notified
//           (settle)                          report but q's (timeout/4, 50 ms-2 s), and
//                                             q's too if a peer blames another rank;
//                                             record the least by (op, code, culprit)
//                                             of the culprits that never reported
// healthy   a failure on any thread           record it; abort the backends; report it  failed
//           (failAnywhere)                    now if no op executes
// failed    executing: the next op starts or  report it to the peers (notifyOnce); the  notified
//           the running one ends              op raises the recorded error
// healthy   this rank rejects op n (reject)   the backends tell the peers; where one    healthy,
//                                             cannot (NCCL), fail with the rejection    notified
// failed,   any failure, settle or            nothing: the recorded error stays, and    same
// notified  rejection                         every call raises it
// clang-format on
//
// Thread safety: error(), record() and failAnywhere() from any thread; the
// rest on the executing thread.
#pragma once

#include <atomic>
#include <chrono>
#include <memory>
#include <vector>

#include "backend/backend.h"
#include "common/sticky_error.h"
#include "core/executor.h"
#include "gflow/error.h"

namespace gflow {

// `e` re-labelled with the op that was waiting on it; fields `ctx` leaves
// unset keep e's.
Error relabel(const Error& e, ErrorContext ctx);
// The rank `e` blames: the culprit a peer's report named (when it is a rank
// of a communicator of `size`), else the peer that failed this rank's wait.
int blamed(const Error& e, int size);

class Verdict {
 public:
  // The communicator's rank, size and op timeout (the settling grace), the
  // backend the peers are reached through, and the executor that runs the
  // ops; before attach(), failures are recorded only.
  struct Parts {
    int rank = 0;
    int size = 1;
    std::chrono::milliseconds timeout{300000};
    backend::Backend* backend = nullptr;
    Executor* executor = nullptr;
  };
  void attach(const Parts& parts) { p_ = parts; }

  // The recorded error (null while healthy).
  std::shared_ptr<const Error> error() const { return sticky_.get(); }
  // Records `e` unless an error is recorded already; returns the recorded one.
  std::shared_ptr<const Error> record(const Error& e);
  // Aborts the backends and tells the peers `e`, once.
  void notifyOnce(const std::shared_ptr<const Error>& e);
  // record() then notifyOnce().
  void fail(const Error& e);
  // fail() for an op's failure that blames another rank: tells the peers
  // this rank's candidate, gathers theirs, records and returns the least.
  Error settle(const Error& candidate);
  // Any thread: records `e` and aborts the backends; the peers hear of it
  // now when no op executes (Executor::tryRunExclusive), else when the
  // running op unwinds.
  void failAnywhere(const Error& e);
  // This rank will not run op `seq` (rejected arguments, `e`).
  void reject(const Error& e, uint64_t seq);

 private:
  // settle()'s verdict from this rank's candidate and the peers' reports:
  // the least by (op, code, culprit) among those whose culprit never
  // reported, where any does; else among all.
  Error choose(const Error& candidate, const std::vector<Error>& reports) const;

  Parts p_;
  StickyError sticky_;  // the first error that failed this communicator
  std::atomic<bool> notified_{false};
};

}  // namespace gflow
