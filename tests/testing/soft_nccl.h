// A software NCCL for tests: an in-process implementation of gflow's NCCL
// table (src/cuda/nccl_api.h) whose collectives run as work on the
// software CUDA's streams (soft_cuda.h), so the NCCL backend runs in CI
// without a GPU. Ranks are threads of one process, each on its own soft
// CUDA device. Never part of libgflow.
//
// enable() makes the soft CUDA table's `nccl` entry answer api().
//
// Behaves like NCCL in non-blocking mode (ncclConfig_t.blocking = 0):
// - commInitRank returns kInProgress; commGetAsyncError answers kInProgress
//   until all nranks ranks of the id joined, then kSuccess. The comm is
//   bound to the caller's current soft CUDA device; two ranks on one device
//   fail the whole init with kInvalidUsage and the last error "Duplicate GPU
//   detected: rank R and rank S both on device D".
// - A collective checks its arguments (a null or unknown comm or a bad
//   dtype/op/root: kInvalidArgument; a comm not ready yet: kInvalidArgument
//   as ncclCommEnsureReady; an aborted or destroyed comm, or one being
//   finalized: kInvalidUsage; a comm in error: its error; a buffer that is
//   not soft CUDA device memory of the comm's device: kInvalidArgument; a
//   stream of another device: kUnhandledCudaError) and enqueues its work on
//   the stream (nullptr: the default stream of the comm's device). A count of
//   0 is a no-op that takes no part in matching (as in NCCL).
// - The work of a comm's k-th collective blocks its stream, like a kernel,
//   until every rank reached its k-th collective; it then reads all inputs,
//   every rank computes the same bits (reduction in rank order 0..n-1,
//   float16/bfloat16 accumulated in float32 and rounded once, avg = sum then
//   one division by n, integers truncating, min/max propagating NaN), and
//   writes its output only after every rank has read its inputs. If the
//   ranks' k-th calls disagree (kind, count, dtype, op, root) they hang, as
//   NCCL would, and mismatches() counts it.
// - reduce is a collective like the others; only the root checks and
//   writes its recvbuff.
// - send/recv: between a pair, the k-th send matches the k-th receive. The
//   calls between groupStart and groupEnd (a call outside a group is a
//   group of one) become one work item per comm on the stream: it posts
//   every send, takes each receive's matching send in call order, and ends
//   once the peers took its sends; so the calls of a group never deadlock
//   one another, while two lone sends toward each other do, as in NCCL. A
//   receive whose matching send has another count or dtype hangs (NCCL
//   leaves that undefined) and mismatches() counts it. A call that fails
//   inside a group makes groupEnd return its error and enqueue nothing.
//   Collectives inside a group return kInvalidUsage (not modelled).
// - commAbort(comm) ends the blocked (and later) work of every comm of its
//   communicator without writing outputs; the other, still live comms of it
//   report kRemoteError from commGetAsyncError (a peer is gone). The comm's
//   memory is kept as a tombstone until disable(): later calls with it
//   return kInvalidUsage instead of crashing.
// - commFinalize returns kInProgress; commGetAsyncError answers kSuccess once
//   the comm's enqueued collectives finished. commDestroy frees (kSuccess);
//   when collectives of the comm are still blocked after 2 s (real NCCL would
//   hang), it aborts the communicator instead, with a note on stderr.
// - commSplit is collective over the parent's ranks (the j-th split of each
//   rank matched together) and non-blocking like init: *out is a comm that
//   becomes ready once every parent rank called; color < 0 gives *out =
//   nullptr (kSuccess). New ranks are ordered by (key, parent rank); the new
//   comm keeps the parent's device.
// - commRevoke (from version 2.28.7) ends the comm's blocked work as
//   commAbort does and returns kInProgress (non-blocking), but keeps the
//   comm: collectives and commFinalize on it return
//   kInvalidUsage, commGetAsyncError answers kInProgress until its enqueued
//   work ended, then kSuccess, and it can be shrunk, aborted or destroyed.
// - commShrink (from 2.27) is collective over the ranks not excluded (the
//   j-th shrink of each matched together) and non-blocking like split: the
//   new comm becomes ready once they all called, ranks in parent order; if
//   their exclusion lists differ, every new comm fails with kInvalidUsage.
//   An empty exclusion list is kInvalidArgument, as in NCCL.
//   abortOngoing (NCCL_SHRINK_ABORT) first ends the parent's work as
//   commRevoke does; without it a parent in error returns its error.
//
// Thread-safe.
#pragma once

#include <string>
#include <vector>

#include "cuda/nccl_api.h"

namespace gflow::testing::softnccl {

constexpr int kVersion = 22809;  // Api::version

// Starts (or restarts) the software NCCL with no communicators and zeroed
// counters; the soft CUDA `nccl` entry answers api() from then on.
void enable();
// Aborts every live communicator (waking their blocked work), forgets all of
// them (tombstones too) and makes the `nccl` entry answer nullptr again.
// softcuda::uninstall() calls it.
void disable();
bool enabled();
const gflow::nccl::Api* api();

struct CommInfo {
  void* comm = nullptr;
  int rank = -1;       // -1 until a split comm is formed
  int nranks = 0;      // 0 until a split comm is formed
  int device = -1;     // soft CUDA device
  int asyncError = 0;  // what commGetAsyncError answers now
};
// Live communicators (not aborted or destroyed), in creation order.
std::vector<CommInfo> comms();

// Makes commGetAsyncError of `comm` answer `result` (e.g. kRemoteError) from
// now on, with a last error naming the injection. Blocked work is not woken
// (a GPU kernel would not be either): abort the comm.
void injectAsyncError(void* comm, int result);
// false: commAbort ends only the aborting rank's work, and the other ranks
// of its communicator keep waiting in their collectives with no error, as
// ranks of real NCCL on other processes may (enable() sets true).
void setAbortReleasesPeers(bool release);
// The next call of table entry `entry` (its field name in gflow::nccl::Api,
// e.g. "allReduce", "commInitRank") returns `result` without doing anything.
// Calls queue up.
void failNextCall(const char* entry, int result);
// The NCCL version the table models (Api::version): below 22807 it has no
// commRevoke, below 22700 no commShrink either. enable() sets kVersion.
void setVersion(int version);

// Per-rank work items of collectives that completed and wrote their output.
int collectivesRun();
// commInitRank calls accepted, commAbort calls on live comms, commSplit calls
// accepted (per rank), and mismatched collectives (per round).
int inits();
int aborts();
int splits();
int mismatches();
// commRevoke calls accepted, and commShrink calls accepted (per rank).
int revokes();
int shrinks();

}  // namespace gflow::testing::softnccl
