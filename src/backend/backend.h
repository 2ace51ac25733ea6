// Backend: runs collectives on one contiguous buffer. Implemented by the
// host backend (gflow's algorithms over a Transport), the shared-memory
// backend, the hierarchical composition of two backends, the staged
// backend (device buffers over a host backend) and NCCL (device buffers);
// the router (backend/router.h) is the one Backend core calls, and runs
// each op on the backend of the op's route (backend/route.h). Layers above
// (core, gradient) only see this.
//
// Calls come from one thread at a time (the communicator's executing thread);
// abort() from any thread.
#pragma once

#include <cstdint>
#include <functional>
#include <memory>
#include <string>
#include <vector>

#include "backend/route.h"
#include "common/deadline.h"
#include "gflow/types.h"
#include "transport/transport.h"

namespace gflow::backend {

enum class OpKind : uint8_t {
  kAllreduce = 1,
  kReduceScatter = 2,
  kAllgather = 3,
  kBroadcast = 4,
  kBarrier = 5,
  kReduce = 6,    // to desc.root
  kGather = 7,    // to desc.root; desc.count elements per rank
  kScatter = 8,   // from desc.root; desc.count elements per rank
  kAlltoall = 9,  // desc.count elements per pair
  // Point-to-point sends and receives (Backend::startPointToPoint), outside the
  // collectives' op order; desc.count and dtype describe each message.
  kPointToPoint = 10,
  // The uneven (v) forms: per-rank blocks (Blocks) instead of desc.count
  // each. desc.count: every rank's elements together (all-to-all: 0, the
  // ranks' counts differ); desc.parent: a digest of the counts every rank
  // passes alike (blocksDigest).
  kAlltoallv = 11,
  kAllgatherv = 12,
  kGatherv = 13,   // to desc.root
  kScatterv = 14,  // from desc.root
};
constexpr size_t kNumOpKinds = 15;  // arrays indexed by OpKind (values 1..14)
const char* toString(OpKind kind);
// The uneven (v) forms, which take per-rank Blocks.
inline bool isUneven(OpKind k) {
  return k == OpKind::kAlltoallv || k == OpKind::kAllgatherv || k == OpKind::kGatherv ||
         k == OpKind::kScatterv;
}

// Everything that must agree across ranks for one collective. Encoded into
// every message's Envelope, so a disagreement is detected by the transport.
struct OpDesc {
  OpKind kind = OpKind::kAllreduce;
  DataType dtype = DataType::kFloat32;
  ReduceOp op = ReduceOp::kSum;
  // Where and how the op runs: chosen by the router (RoutePolicy::choose)
  // for the ops core submits; set by the caller for a composed op's phases.
  Route route;
  int root = 0;
  // allreduce/broadcast/reduce: elements; reduce-scatter/allgather/gather/
  // scatter: per rank; alltoall: per pair.
  uint64_t count = 0;
  // For the phases of a composed op (hierarchical): fingerprint() of the op
  // they belong to, so phases of ops that differ never match. 0 otherwise.
  uint64_t parent = 0;
  // Allreduce and reduce-scatter of floating-point data asked for in
  // reproducible mode: the route's algorithm will be kFixedOrder.
  bool reproducible = false;
};
transport::Envelope encode(const OpDesc& d);
// A 24-bit nonzero digest of everything in `d` that must agree across ranks.
uint64_t fingerprint(const OpDesc& d);
std::string describe(const transport::Envelope& e);

class DeviceBuffers;  // backend/device_buffers.h

// Per-rank blocks of a buffer, in elements (the uneven ops): block r is
// counts[r] elements at offsets[r].
struct Blocks {
  std::vector<uint64_t> counts, offsets;
  // Block r at r * count.
  static Blocks equal(int ranks, uint64_t count);
  // One after another, in rank order.
  static Blocks packed(std::vector<uint64_t> counts);
  uint64_t total() const;
};
// A nonzero 24-bit digest of `counts` (OpDesc::parent of the uneven ops).
uint64_t blocksDigest(const std::vector<uint64_t>& counts);

// One send or receive of a point-to-point op (Backend::startPointToPoint).
struct P2PMessage {
  bool send = true;
  // The other rank; a receive may take kAnySource (any rank's message of
  // `tag`), and learns the sender in `source`.
  int peer = 0;
  static constexpr int kAnySource = -1;
  int tag = 0;  // >= 0
  DataType dtype = DataType::kFloat32;
  uint64_t count = 0;
  void* data = nullptr;  // send: read; receive: written
  int source = -1;       // set by the backend: the rank the message came from
  // The message's header only: its payload travels through NCCL. `data`
  // points to 8 bytes of host memory (the sender's NCCL sequence number to
  // the peer); dtype and count describe the payload, and the envelope says
  // "nccl", so a receive of another size or one that expects the payload
  // itself raises kMismatch.
  bool viaNccl = false;
};

struct Op {
  uint64_t seq = 0;
  OpDesc desc;
  Deadline deadline = Deadline::never();
  // Set when any of the op's buffers is device memory: where they live and
  // the events after the work that produces them (null: host memory).
  std::shared_ptr<DeviceBuffers> buffers;
};

// Adds `p` to `into` (composed backends sum their parts' traffic).
inline void accumulate(PeerStats& into, const PeerStats& p) {
  into.bytesSent += p.bytesSent;
  into.bytesReceived += p.bytesReceived;
  into.messagesSent += p.messagesSent;
  into.messagesReceived += p.messagesReceived;
  into.singleCopyBytesSent += p.singleCopyBytesSent;
  into.connections += p.connections;
}

// A point-to-point op in flight (Backend::startPointToPoint). Used by the
// executing thread only.
class P2PInFlight {
 public:
  virtual ~P2PInFlight() = default;
  // Drives progress once without blocking; true once every message is done.
  // Throws the op's error; past the op's deadline, waits as wait() does.
  virtual bool test() = 0;
  // Until every message is done; throws the op's error (kTimeout naming the
  // peer at the deadline).
  virtual void wait() = 0;
  // The messages, with each receive's `source` once done.
  virtual const std::vector<P2PMessage>& messages() const = 0;
};

class Backend {
 public:
  virtual ~Backend() = default;
  virtual void allreduce(const Op& op, const void* in, void* out) = 0;
  // in: desc.count * size elements; out: desc.count elements.
  virtual void reduceScatter(const Op& op, const void* in, void* out) = 0;
  // in: desc.count elements; out: desc.count * size elements.
  virtual void allgather(const Op& op, const void* in, void* out) = 0;
  virtual void broadcast(const Op& op, void* buf) = 0;
  virtual void barrier(const Op& op) = 0;
  // The rooted ops and all-to-all. A backend that no route leads them to
  // (backend/route_policy.cc) keeps these defaults, which raise kInternal
  // naming the backend and the op.
  // in: desc.count elements; out: desc.count elements, written on the root
  // only (ignored elsewhere). `in` is never written.
  virtual void reduce(const Op& op, const void* in, void* out);
  // in: desc.count elements; out (root only): desc.count * size, by rank.
  virtual void gather(const Op& op, const void* in, void* out);
  // in (root only): desc.count * size elements, by rank; out: desc.count.
  virtual void scatter(const Op& op, const void* in, void* out);
  // in and out: desc.count * size elements; block j of in goes to rank j,
  // block j of out comes from rank j. in and out do not overlap.
  virtual void alltoall(const Op& op, const void* in, void* out);
  // The uneven forms. alltoallv: block j of `in` (inBlocks) goes to rank j,
  // block j of `out` (outBlocks) comes from rank j; allgatherv runs as an
  // alltoallv whose in blocks are all this rank's input. gatherv: rank r's
  // `in` (blocks.counts[r] elements) lands in block r of the root's `out`;
  // scatterv: block r of the root's `in` lands in rank r's `out`.
  virtual void alltoallv(const Op& op, const void* in, const Blocks& inBlocks, void* out,
                         const Blocks& outBlocks);
  virtual void gatherv(const Op& op, const void* in, void* out, const Blocks& blocks);
  virtual void scatterv(const Op& op, const void* in, const Blocks& blocks, void* out);
  // Posts every message of `msgs` at once (so two ranks that each send to
  // the other first cannot deadlock) and returns them in flight; a receive
  // from any source is posted once a message for it has arrived. Between a
  // pair, messages of one tag match in the order they were posted (MPI's
  // non-overtaking rule); a receive's dtype and count must match the send's
  // (kMismatch). Not part of the op order: ranks outside the messages do
  // nothing. op.desc.kind is kPointToPoint.
  virtual std::unique_ptr<P2PInFlight> startPointToPoint(const Op& op,
                                                         std::vector<P2PMessage> msgs);
  // For the defaults' message.
  virtual const char* name() const = 0;

  virtual void abort(const Error& error) = 0;
  virtual void notifyPeers(const Error& error) = 0;
  // After a failure: the peers' failure reports, once every peer but
  // `exclude` (communicator numbering) has reported or is gone, or at
  // `until` (transport::Context::awaitReports). Executing thread.
  virtual std::vector<Error> awaitReports(Deadline until, int exclude) {
    (void)until;
    (void)exclude;
    return {};
  }
  // This rank will not run op `seq` (the call's arguments were rejected,
  // `why`): tells the peers without failing (transport::Context::reject), so
  // one that runs the op fails at once and one that rejected it too goes on.
  // False where the backend cannot (a peer's op may be past recall, as an
  // NCCL kernel is): the caller then fails the communicator instead.
  // Executing thread, between ops.
  virtual bool reject(uint64_t seq, const std::string& why) {
    (void)seq;
    (void)why;
    return false;
  }
  virtual PeerStats peerStats(int peer) const = 0;
  // Registers user memory with every network transport context of this
  // backend (zero-copy RDMA); the regions are valid while `out` holds them.
  // Thread-safe with respect to running ops.
  virtual void registerMemory(void* data, size_t bytes,
                              std::vector<std::unique_ptr<transport::MemoryRegion>>* out) = 0;
  // Communicator::split, collective over this backend's ranks, after the
  // new communicator's own backend `child` (built like this one; nullptr
  // where this rank joins no part, color < 0) has connected: hands `child`
  // what it derives from this backend rather than creating anew (NCCL's
  // ncclCommSplit). Most backends derive nothing.
  virtual void splitInto(const Op& op, int color, int key, Backend* child) {
    (void)op, (void)color, (void)key, (void)child;
  }
  // Communicator::shrink, on this (the old communicator's) executing
  // thread: whether this backend holds what a shrink can derive the new
  // communicator's part from (NCCL's ncclCommShrink). shrinkInto runs only
  // where every survivor answered true, collective over the survivors,
  // after the new communicator's own backend `child` connected: hands
  // `child` the part without the `excluded` ranks (this backend's
  // numbering, sorted). `failed`: this communicator failed, so work still
  // ongoing in it ends first. A shrinkInto that throws leaves nothing to
  // shrink from (canShrink() false).
  virtual bool canShrink() const { return false; }
  virtual void shrinkInto(const Op& op, const std::vector<int>& excluded, bool failed,
                          Backend* child) {
    (void)op, (void)excluded, (void)failed, (void)child;
  }
  // Liveness across the phases of a composed op (the hierarchical backend):
  // answerProbes() answers the peers' probes without blocking (and may raise
  // this backend's error); `hook` runs while this backend's waits sleep, at
  // least every half probe grace (transport/liveness.h). Owning thread; set
  // before the first op. Only backends that a composition uses as a phase
  // (shared memory, the host backend) implement them.
  virtual void answerProbes() {}
  virtual void setWhileWaiting(std::function<void()> hook) { (void)hook; }
};

// The host backend over a connected transport context. `tuning`: its ring
// piece size and window (fields left unset: GFLOW_PIECE_BYTES and
// GFLOW_RING_WINDOW); the other fields are not its business.
std::unique_ptr<Backend> createHostBackend(std::unique_ptr<transport::Context> context,
                                           const TuningOptions& tuning = {});

}  // namespace gflow::backend
