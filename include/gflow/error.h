// The gflow error model (docs/errors.md). Every failure surfaces as a
// gflow::Error thrown from the call (or from Work::wait for async work).
// Once a communicator has failed it keeps raising the original error until it
// is destroyed.
#pragma once

#include <cstdint>
#include <stdexcept>
#include <string>
#include <utility>

#include "gflow/export.h"

namespace gflow {

enum class ErrorCode : uint8_t {
  kInvalidArgument = 0,  // the caller passed something wrong; nothing was sent
  kTimeout = 1,          // a deadline passed while waiting on a peer
  kPeerLost = 2,         // a peer closed its connection or died
  kMismatch = 3,         // ranks called different collectives / shapes
  kUnauthorized = 4,     // a peer failed the job-token challenge
  kAborted = 5,          // Communicator::abort() was called
  kInternal = 6,         // a system call failed or an invariant broke
};

GFLOW_EXPORT const char* toString(ErrorCode code);

// Where an error happened. Fields that do not apply are left at their
// defaults (empty op, seq 0, rank/peer -1). Build one by naming the fields
// that apply:
//   ErrorContext::forOp("allreduce").withSeq(seq).withRank(rank).withPeer(peer)
// Each with* returns a copy with that field set.
struct ErrorContext {
  std::string op;    // "allreduce", "broadcast", "bootstrap", ...
  uint64_t seq = 0;  // the op's sequence number on its communicator (1-based)
  int rank = -1;     // the rank raising the error
  int peer = -1;     // the peer involved, if any: at the API, the rank this error blames
  // What a peer's failure report said, in the communicator's numbering: the
  // rank it blames (-1: none) and the op it failed in (0: none). The
  // communicator settles every rank's report into one verdict (errors.md),
  // so all ranks that hear of a failure raise the same code, op and culprit.
  int culprit = -1;
  uint64_t reportedSeq = 0;

  static ErrorContext forOp(std::string name) { return ErrorContext().withOp(std::move(name)); }
  ErrorContext withOp(std::string name) const {
    ErrorContext c = *this;
    c.op = std::move(name);
    return c;
  }
  ErrorContext withSeq(uint64_t s) const {
    ErrorContext c = *this;
    c.seq = s;
    return c;
  }
  ErrorContext withRank(int r) const {
    ErrorContext c = *this;
    c.rank = r;
    return c;
  }
  ErrorContext withPeer(int p) const {
    ErrorContext c = *this;
    c.peer = p;
    return c;
  }
  ErrorContext withCulprit(int r, uint64_t s) const {
    ErrorContext c = *this;
    c.culprit = r;
    c.reportedSeq = s;
    return c;
  }
};

class GFLOW_EXPORT Error : public std::runtime_error {
 public:
  Error(ErrorCode code, const std::string& detail, ErrorContext ctx = {});

  ErrorCode code() const noexcept { return code_; }
  const std::string& detail() const noexcept { return detail_; }
  const ErrorContext& context() const noexcept { return ctx_; }
  const std::string& op() const noexcept { return ctx_.op; }
  uint64_t seq() const noexcept { return ctx_.seq; }
  int rank() const noexcept { return ctx_.rank; }
  int peer() const noexcept { return ctx_.peer; }

 private:
  ErrorCode code_;
  std::string detail_;
  ErrorContext ctx_;
};

}  // namespace gflow
