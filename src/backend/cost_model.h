// CostModel: what a flat allreduce over the network costs, by algorithm,
// in the alpha-beta-gamma form (Hockney's alpha-beta, with gamma for the
// reduction, as Thakur, Rabenseifner and Gropp write the MPI collectives):
//   alpha  seconds per message (latency, and the per-message work of both
//          ends),
//   beta   seconds per byte on the wire (the inverse of a rank's
//          bandwidth),
//   gamma  seconds per byte reduced.
// For N ranks, n bytes, q the largest power of two <= N:
//   ring (reduce-scatter then allgather, 2(N-1) steps of n/N bytes)
//     2(N-1) alpha + 2 (N-1)/N n beta + (N-1)/N n gamma
//   recursive doubling (log2 q exchanges of the whole buffer)
//     log2(q) (alpha + n beta + n gamma) + fold
//   halving-doubling (recursive halving, then doubling)
//     2 log2(q) alpha + 2 (q-1)/q n beta + (q-1)/q n gamma + fold
//   fold (N not a power of two: the first 2(N-q) ranks pair up before and
//   after, fold.h)  2 alpha + 2 n beta + n gamma
// The parameters are measured, never typed in: fit() takes timed runs of
// the three algorithms (allreduce_bw --calibrate FILE makes them on the job
// it runs in) and solves for the three by least squares, since each time
// is linear in them. A model is text (text(), parse()): GFLOW_MODEL=FILE
// loads one, and the route policy then picks the algorithm it predicts
// fastest (route_policy.h). It knows nothing of a host's shared memory, of
// the hierarchical composition or of ranks that share a NIC: the policy
// keeps its own choice for those paths.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "backend/route.h"

namespace gflow::backend {

class CostModel {
 public:
  struct Params {
    double alpha = 0;  // s per message
    double beta = 0;   // s per byte sent
    double gamma = 0;  // s per byte reduced
  };
  // One timed allreduce: `seconds` for `bytes` over `ranks` by `algo`.
  struct Sample {
    Algorithm algo;
    uint64_t bytes;
    int ranks;
    double seconds;
  };
  // The algorithms the model predicts (the flat network allreduce's).
  static const std::vector<Algorithm>& algorithms();

  explicit CostModel(const Params& p) : p_(p) {}
  const Params& params() const { return p_; }

  // Predicted seconds of one allreduce (0 for one rank); an algorithm the
  // model does not know gets +infinity.
  double predict(Algorithm algo, uint64_t bytes, int ranks) const;
  // The algorithm of algorithms() with the least predicted time (ties to
  // the earlier in that list).
  Algorithm fastest(uint64_t bytes, int ranks) const;

  // The least-squares fit of `samples` (times weighted relatively, so
  // small messages count as much as large ones); parameters come out >= 0.
  // Throws Error(kInvalidArgument) when the samples cannot determine all
  // three (fewer than three, or sizes that do not vary).
  static CostModel fit(const std::vector<Sample>& samples);

  // "gflow-model 1 alpha=A beta=B gamma=G" (seconds, %.9g each); parse()
  // reads it back, throwing Error(kInvalidArgument) naming `source` and
  // what is wrong.
  std::string text() const;
  static CostModel parse(const std::string& text, const std::string& source);
  // parse() of the file at `path`.
  static CostModel load(const std::string& path);

 private:
  Params p_;
};

}  // namespace gflow::backend
