// The sweep (allreduce, or the collective of --op) shared by gflow's allreduce_bw and the Gloo and
// MPI harnesses. A driver only adapts its library to Backend; timing, checking and reporting live
// here once, so the three measure the same thing.
//
// Per (dtype, op, size) and per mode (out-of-place, then in-place with -m 1):
//   1. fill the buffers with values that stay constant under the op (0, or 1
//      for prod), so repeated in-place runs neither overflow integers nor
//      drift into inf/denormal floats;
//   2. warm up, barrier, time `iters` back-to-back runs; the reported time is
//      the max over ranks of each rank's mean (a MAX allreduce); where the
//      library counts its traffic per peer, the bytes each link carried per
//      op come from the counters read around those runs (common/links.h);
//   3. with -c 1, fill the check pattern (common/pattern.h), run once more
//      and count wrong elements, summed over ranks.
#pragma once

#include <cstddef>
#include <cstdint>
#include <functional>
#include <string>
#include <vector>

#include "common/collective.h"
#include "common/links.h"
#include "common/options.h"
#include "common/report.h"
#include "gflow/types.h"

namespace gflow::bench {

class Backend {
 public:
  virtual ~Backend() = default;

  virtual int rank() const = 0;
  virtual int size() const = 0;
  // For the report header: library, algorithm label, extra line.
  virtual RunInfo info() const = 0;
  // Combinations a backend cannot run are skipped with a note.
  virtual bool supports(DataType dtype, ReduceOp op) const = 0;
  virtual bool supports(Collective c) const { return c == Collective::kAllreduce; }

  // Binds one run of `c` on `count` elements (the sweep's size, see
  // common/collective.h; a multiple of size() for the block ops) to its
  // buffers and returns the callable the sweep times. in == out means
  // in-place (allreduce); broadcast runs in place on `out` from root
  // kSweepRoot, as do the other rooted ops. Libraries that set an
  // algorithm up per buffer (Gloo) do it here, outside the timed loop.
  virtual std::function<void()> prepare(Collective c, void* in, void* out, size_t count,
                                        DataType dtype, ReduceOp op) = 0;
  // Backends that run on copies of the buffers (device memory) move the
  // host contents there after each fill and bring the result back before
  // the check; neither is timed.
  virtual void upload(const void* /*in*/, const void* /*out*/, size_t /*bytes*/) {}
  virtual void download(void* /*out*/, size_t /*bytes*/) {}

  virtual void barrier() = 0;
  virtual double maxOverRanks(double v) = 0;
  virtual int64_t sumOverRanks(int64_t v) = 0;
  // Element-wise; one collective where the library has a vector form.
  virtual void sumOverRanks(std::vector<int64_t>& v) {
    for (int64_t& x : v) x = sumOverRanks(x);
  }
  // This rank's traffic counters per rank (common/links.h), read around the
  // timed runs; empty when the library does not count per peer.
  virtual std::vector<PeerLink> links() const { return {}; }
};

// Runs the sweep and prints the report on rank 0. Returns the process exit
// code: 0, or 1 when a result was wrong (every rank returns the same).
int runSweep(Backend& backend, const SweepConfig& cfg);

}  // namespace gflow::bench
