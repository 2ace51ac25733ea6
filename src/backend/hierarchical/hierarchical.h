// Hierarchical collectives, written once over the Backend interface: a
// `local` backend joins the ranks of this host and a `cross` backend joins
// the ranks that have this rank's local rank, one per host. For host
// buffers they are shared memory (or TCP/verbs where it is unavailable) and
// TCP or verbs; for device buffers, NCCL communicators split off the
// communicator's own (backend/nccl/nccl_backend.h).
//
// allreduce, every host with the same number of ranks L:
//   local reduce-scatter (rank l gets block l summed over the host, in its
//   own place in the output)
//   -> cross allreduce of block l among the hosts
//   -> local allgather of the blocks (in place).
// Each rank moves 1/L of the data across hosts, so all L ranks of a host use
// the network at once and the host-to-host traffic is that of one ring over
// hosts (not over ranks). Elements that do not fill L equal blocks (count %
// L) take a local allreduce + cross allreduce of their own.
// allreduce, hosts with different rank counts (leaders = local rank 0):
//   local allreduce -> cross allreduce among the leaders -> local broadcast.
// broadcast: local broadcast on the root's host -> leaders -> local broadcast.
// barrier:   local barrier -> leaders' barrier -> local barrier.
// reduce-scatter (equal hosts): regroup the blocks by local rank -> local
//   reduce-scatter -> cross reduce-scatter.
// allgather (equal hosts): cross allgather -> local allgather -> ungroup.
// avg is a sum divided on the host at the end; reduce-scatter, allgather
// and avg touch memory directly, so they take host buffers only (the NCCL
// backend runs them flat).
#pragma once

#include <functional>
#include <memory>
#include <vector>

#include "backend/backend.h"

namespace gflow::backend {

struct Hierarchy {
  int rank = 0;
  int size = 1;
  std::vector<int> hostOf;       // host index of every rank (hosts numbered by first rank)
  std::vector<int> localRankOf;  // local rank of every rank
  int numHosts = 1;
  bool uniform = true;  // every host has the same number of ranks

  int localRank() const { return localRankOf[rank]; }
  int host() const { return hostOf[rank]; }
  int localSize() const { return localSizeOf(host()); }
  int localSizeOf(int host) const;
  // Ranks of `host`, ordered by rank (local rank order).
  std::vector<int> ranksOfHost(int host) const;
  // Ranks whose local rank is `localRank`, ordered by host.
  std::vector<int> ranksWithLocalRank(int localRank) const;

  // Learns the hierarchy from every rank's host identity hash.
  static Hierarchy fromHostHashes(int rank, const std::vector<uint64_t>& hostHash);
};

// The routes of the phases (RoutePolicy::phase for the host parts, NCCL's
// own for NCCL's), from the phase's kind, bytes and group size.
using RouteOf = std::function<Route(OpKind, uint64_t bytes, int groupSize)>;
struct PhaseRoutes {
  RouteOf local, cross;
};

// `local`: the ranks of this host (ranksOfHost(host())); `cross`: the ranks
// with this rank's local rank (ranksWithLocalRank(localRank())). Both number
// their members from 0 in that order. `segmentBytes`: how much of a large
// allreduce one pipelined segment carries (0: GFLOW_HIER_SEGMENT).
std::unique_ptr<Backend> createHierarchicalBackend(const Hierarchy& h,
                                                   std::unique_ptr<Backend> local,
                                                   std::unique_ptr<Backend> cross,
                                                   PhaseRoutes routes, uint64_t segmentBytes = 0);

}  // namespace gflow::backend
