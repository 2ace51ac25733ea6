// Per-link bytes beside busbw. busbw assumes that every rank sends the
// ring's 2(n-1)/n of the data over its link; an algorithm that sends less
// over each link (the hierarchical composition across hosts, recursive
// doubling split over two media, trees) reports a busbw no link ever ran at.
// A library that counts its traffic per peer gives each rank's received
// bytes before and after the timed runs; every rank's counts are summed
// into the whole matrix, so the report can say what each rank pair carried
// per op, what each rank sent and received over the network and over shared
// memory (its two links, each way), and flag a busbw above the busiest
// link's measured rate.
#pragma once

#include <cstdint>
#include <vector>

namespace gflow::bench {

class Backend;

// One rank's counter for one peer: payload bytes received from it so far,
// and whether it shares this rank's host (shared memory, never the network).
struct PeerLink {
  uint64_t received = 0;
  bool sameHost = false;
};

struct LinkBytes {
  int ranks = 0;
  std::vector<double> pair;             // ranks x ranks: bytes per op from row to column
  std::vector<uint8_t> sameHost;        // ranks x ranks
  std::vector<double> networkSent;      // per rank: bytes per op to other hosts
  std::vector<double> localSent;        // per rank: bytes per op to its own host
  std::vector<double> networkReceived;  // per rank: bytes per op from other hosts
  std::vector<double> localReceived;    // per rank: bytes per op from its own host
  // The busiest link: the most one rank moved over one medium in one
  // direction per op (a gather's root receives what busbw counts).
  double busiest = 0;
  int busiestRank = -1;
  bool busiestIsNetwork = false;
  bool busiestIsSend = true;

  double maxNetworkSent() const;
  double maxLocalSent() const;
  // busbw (GB/s) above what the busiest link carried at the op time (1%
  // slack for uneven chunks): the figure is no link's rate.
  bool busbwAboveBusiest(double busbw, double timeUs) const;
};

// Collective over the backend's ranks: `before` and `after` are this rank's
// counters (indexed by rank) around `iters` runs of the op.
LinkBytes gatherLinks(Backend& be, const std::vector<PeerLink>& before,
                      const std::vector<PeerLink>& after, int iters);

}  // namespace gflow::bench
