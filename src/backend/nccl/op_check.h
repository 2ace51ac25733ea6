// The NCCL op check (Options::device.verifyOps, GFLOW_NCCL_VERIFY): before
// a rank's NCCL op can end, every rank has confirmed over the host path
// that all called the same op, so ranks that call different ops (or stage
// this one) fail with kMismatch, naming the op and the rank, instead of
// hanging inside NCCL or completing with garbage.
//
// The check is a tiny allgather over the host path whose envelope carries
// the op's fingerprint (24 bits). Its values: a digest of the op's whole
// description (64 bits) and, for all-to-all-v (whose counts differ by
// rank), every rank's send and receive counts, or beyond kCountsInCheck
// ranks the sums of its digests of each pair's send count and of each
// pair's receive count, whose totals over all ranks agree exactly when every
// send matches its receive. Every rank sees the same values and reaches the
// same verdict in one round, whose width every rank knows.
//
// The NCCL backend runs it beside the op: after the op is enqueued on the
// GPU and before it waits for it (NcclBackend::finish), so the GPU works
// while the host round trip runs, and a failing check aborts NCCL before it
// raises. Executing thread.
#pragma once

#include <functional>

#include "backend/backend.h"

namespace gflow::backend {

// An all-to-all-v's blocks, which the check compares (null: not one).
struct CheckedCounts {
  const Blocks* in = nullptr;
  const Blocks* out = nullptr;
};

class NcclOpCheck {
 public:
  // Up to this many ranks the all-to-all-v check carries every count (and
  // names the pair that disagrees); beyond, two digest sums per rank.
  static constexpr int kCountsInCheck = 64;

  // `host`: the host paths of the communicator (rank `rank` of `size`);
  // `route`: the route of the check's allgather (RoutePolicy::choose).
  NcclOpCheck(int rank, int size, Backend& host, std::function<Route(const OpDesc&)> route);

  // Raises kMismatch where the ranks' ops differ, and the host path's error.
  void run(const Op& op, const CheckedCounts& counts) const;

 private:
  int rank_;
  int size_;
  Backend& host_;
  std::function<Route(const OpDesc&)> route_;
};

}  // namespace gflow::backend
