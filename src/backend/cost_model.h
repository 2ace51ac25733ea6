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
// the three algorithms (gflow_model calibrate makes them on the job it runs
// in) and solves for the three by least squares, since each time is linear
// in them. A model is text (text(), parse()): GFLOW_MODEL=FILE loads one,
// and the route policy then picks the algorithm it predicts fastest
// (route_policy.h).
//
// Hosts with several ranks (Layout: H hosts of L ranks, numbered host by
// host) need two more parameters, of the host's shared memory, fitted by
// withLocal() from timed shared-memory allreduces on one host:
//   local_alpha  seconds per message between two ranks of a host,
//   local_beta   seconds per byte between them.
// A host's L ranks share its NIC, so a step in which all of them exchange
// with other hosts moves L times the bytes through it:
//   ring: one edge per host leaves it, so the flat form above with N = HL;
//   rd, hd: a step costs local_beta per byte where every pair is on one
//     host, and F beta where F of a host's ranks send off the host at once
//     (the most of any host), with the folded ranks of a world that is not
//     a power of two mapped as fold.h maps them;
//   hierarchical: a local reduce-scatter and allgather in shared memory,
//     2(L-1) local_alpha + 2 (L-1)/L n local_beta + (L-1)/L n gamma,
//     and L concurrent allreduces of n/L bytes across the H hosts (the
//     fastest flat form with L beta); gflow pipelines the two over
//     S = ceil(n / segment) segments, so with both phases' times for one
//     segment, T = local + cross + (S-1) max(local, cross).
#pragma once

#include <cstdint>
#include <memory>
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
    // A host's shared memory (hasLocal: fitted; else unknown).
    bool hasLocal = false;
    double localAlpha = 0;  // s per message
    double localBeta = 0;   // s per byte
  };
  // H hosts of L ranks each, numbered host by host.
  struct Layout {
    int hosts = 1;
    int perHost = 1;
    int ranks() const { return hosts * perHost; }
  };
  // What the model picks for an allreduce across hosts: the hierarchical
  // composition, or the flat algorithm `algo`.
  struct Choice {
    bool hierarchical = false;
    Algorithm algo = Algorithm::kAuto;
    double seconds = 0;
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

  explicit CostModel(const Params& p);
  const Params& params() const { return p_; }

  // Predicted seconds of one allreduce (0 for one rank); an algorithm the
  // model does not know gets +infinity.
  double predict(Algorithm algo, uint64_t bytes, int ranks) const;
  // The algorithm of algorithms() with the least predicted time (ties to
  // the earlier in that list).
  Algorithm fastest(uint64_t bytes, int ranks) const;
  // The flat algorithm over a layout's ranks, with the NIC shared (above);
  // without local parameters a partner on the host costs beta.
  double predict(Algorithm algo, uint64_t bytes, const Layout& layout) const;
  // A shared-memory allreduce on one host of `ranks` (a reduce-scatter and
  // an allgather: the ring's form with the local parameters); +infinity
  // without them.
  double predictLocal(uint64_t bytes, int ranks) const;
  // The hierarchical composition in segments of `segmentBytes`
  // (GFLOW_HIER_SEGMENT); +infinity without local parameters.
  double predictHierarchical(uint64_t bytes, const Layout& layout, uint64_t segmentBytes) const;
  // The least predicted of the hierarchical composition and the flat
  // algorithms over `layout` (the flat one on a tie).
  Choice fastest(uint64_t bytes, const Layout& layout, uint64_t segmentBytes) const;

  // The least-squares fit of `samples` (times weighted relatively, so
  // small messages count as much as large ones); parameters come out >= 0.
  // Throws Error(kInvalidArgument) when the samples cannot determine all
  // three (fewer than three, or sizes that do not vary).
  static CostModel fit(const std::vector<Sample>& samples);
  // This model with local_alpha and local_beta fitted to timed shared-
  // memory allreduces on one host (Sample::algo ignored, `ranks` the
  // host's); gamma is this model's. Throws as fit() does.
  CostModel withLocal(const std::vector<Sample>& samples) const;

  // "gflow-model 1 alpha=A beta=B gamma=G" (seconds, %.9g each), and with
  // local parameters "gflow-model 2 ... local_alpha=LA local_beta=LB";
  // parse() reads either back, throwing Error(kInvalidArgument) naming
  // `source` and what is wrong.
  std::string text() const;
  static CostModel parse(const std::string& text, const std::string& source);
  // parse() of the file at `path`.
  static CostModel load(const std::string& path);

 private:
  // What rd's and hd's steps cost per message and per byte on a layout
  // (computed once per layout; shared by copies).
  struct Step {
    double alpha;
    double beta;
  };
  struct Steps {
    Layout layout;
    std::vector<Step> exchange;  // step k: partners 2^k apart (virtual ranks)
    Step fold{0, 0};             // the fold's, when the world is not a power of two
    bool folds = false;
  };
  struct StepCache;
  std::shared_ptr<const Steps> stepsOf(const Layout& l) const;

  Params p_;
  std::shared_ptr<StepCache> cache_;
};

}  // namespace gflow::backend
