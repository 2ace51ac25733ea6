// Communicator: a group of ranks that run collectives together.
//
// Ordering: every rank must issue the same collectives, with the same
// arguments, in the same order (blocking and async calls share one order).
// A disagreement raises gflow::Error(kMismatch) on every rank.
//
// Thread safety: calls on one communicator may come from several threads but
// are serialized in the order they are issued; abort() may be called from any
// thread at any time and wakes every waiter.
//
// Errors: once an op fails the communicator is failed; every later call and
// every pending Work raises the original error.
#pragma once

#include <chrono>
#include <cstdint>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "gflow/error.h"
#include "gflow/export.h"
#include "gflow/options.h"
#include "gflow/types.h"

namespace gflow {

// Handle to an asynchronous collective. Copyable; all copies share the state.
class GFLOW_EXPORT Work {
 public:
  // What a Work reports on: the completion of one op. gflow's ops implement
  // it; a front end may implement it to hand out Works of its own.
  class Completion {
   public:
    virtual ~Completion();
    virtual bool done() const = 0;
    // Waits up to `timeout` (0: until done); rethrows the op's error.
    virtual void wait(std::chrono::milliseconds timeout) = 0;
    // Whether the op's result held an inf or NaN (once done).
    virtual bool nonFinite() const = 0;
  };

  Work() = default;
  explicit Work(std::shared_ptr<Completion> completion) : state_(std::move(completion)) {}

  // True once the op has finished (successfully or not). Never blocks.
  bool test() const;
  // Waits until the op finished; rethrows its error. A timeout of 0 waits until
  // the op ends, which every op does by the communicator's deadline. Throws
  // Error(kTimeout) if `timeout` passes first (the op itself keeps running and
  // may still complete).
  void wait(std::chrono::milliseconds timeout = std::chrono::milliseconds(0)) const;
  bool valid() const { return state_ != nullptr; }
  // After the op completed: whether its result held an inf or NaN (an
  // allreduce with AllreduceOptions; false for other ops). Every rank agrees.
  bool nonFinite() const;

 private:
  std::shared_ptr<Completion> state_;
};

// An allreduce's options beyond its operator (Communicator::allreduce), on
// cpu or cuda tensors alike: on a GPU the conversions, scales and the
// inf/NaN scan run as kernels on the tensor's stream around the collective
// (docs/compression.md); staged through host memory the results are the cpu
// path's bits, on NCCL a compressed wire is summed in the wire type.
struct AllreduceOptions {
  ReduceOp op = ReduceOp::kSum;
  // For float32 data, the type on the wire: kFloat16 or kBFloat16 halve the
  // bytes. Every reduction hop of gflow's host algorithms widens to float32,
  // applies the op and rounds once to the wire type (docs/compression.md
  // bounds the error); all ranks get the same bits. kQInt8 and kQInt4
  // (block-quantized, 0.26x and 0.13x the bytes; sum, avg, min, max) do the
  // same per block of kQuantBlock values (dequantize, op in float32,
  // quantize). kFloat32 (or the tensor's own dtype): no compression.
  DataType wire = DataType::kFloat32;
  // Error feedback for a quantized wire (docs/compression.md): float32,
  // inout.count values on inout's device, that the caller keeps from one
  // step to the next (zeros at the start). The prescaled input plus it is
  // quantized, and it is set to what quantizing lost, which the next step
  // sends. Empty (data null): none.
  Tensor residual{};
  // float32 data only: the input is multiplied by `prescale` before it is
  // narrowed (e.g. 1/N with kSum keeps float16 sums of N ranks in range),
  // the result by `postscale` after it is widened.
  float prescale = 1.0f;
  float postscale = 1.0f;
  // Reproducible mode for this op (Options::reproducible); unset: the
  // communicator's. Every rank must pass the same (kMismatch otherwise; on
  // several hosts, kTimeout at the op's deadline: docs/errors.md).
  std::optional<bool> reproducible;
};

struct AllreduceResult {
  // The result holds an inf or NaN (overflow of the wire type, or a rank's
  // input): a loss scaler skips the step. Every rank gets the same answer.
  bool nonFinite = false;
};

struct GFLOW_EXPORT Stats {
  std::vector<PeerStats> peers;  // indexed by peer rank
  uint64_t allreduce = 0;
  uint64_t reduceScatter = 0;
  uint64_t allgather = 0;
  uint64_t broadcast = 0;
  uint64_t barrier = 0;
  uint64_t reduce = 0;
  uint64_t gather = 0;
  uint64_t scatter = 0;
  uint64_t alltoall = 0;      // the v forms count with their even ones
  uint64_t pointToPoint = 0;  // send, recv and sendRecv calls (a sendRecv counts once)
  // The same ops by the path that ran them: the shared-memory backend (one
  // host), the hierarchical one (several hosts), a flat algorithm over the
  // network transport, or NCCL (device buffers). Device buffers that are
  // staged through host memory count in the host path that ran them and in
  // stagedOps.
  uint64_t sharedMemoryOps = 0;
  uint64_t hierarchicalOps = 0;
  uint64_t networkOps = 0;
  uint64_t ncclOps = 0;
  uint64_t stagedOps = 0;
  // The route every op took: its kind ("allreduce", ...), the path ("shm",
  // "hierarchical", "network", "nccl", "nccl-hierarchical") and the
  // algorithm on it ("ring", "rd", "hd", "slots", "single-copy",
  // "fixed-order", ...; "auto": NCCL's own choice, or the hierarchical
  // phases' own), with how many ops took it. One entry per route taken.
  struct Route {
    std::string op, path, algorithm;
    uint64_t ops = 0;
  };
  std::vector<Route> routes;
  // What this rank holds of the job's resources now: peers it has a
  // connection to (PeerStats::connections > 0) and those connections; the
  // store requests its process made and, on the rank that serves the
  // store, answered; threads gflow started in this process; bytes of
  // memory it pinned (verbs registrations, CUDA pinned staging) and
  // shared-memory segments it created (the shared-memory group's, local
  // rings). At hundreds of ranks these are what runs out.
  struct Resources {
    uint64_t peersConnected = 0;
    uint64_t connections = 0;
    uint64_t storeRequests = 0;
    uint64_t storeServed = 0;
    uint64_t threadsStarted = 0;
    uint64_t pinnedBytes = 0;
    uint64_t sharedBytes = 0;
  };
  Resources resources;
  // Collectives with a straggler verdict (PeerStats::timesLast sums to it);
  // 0 under GFLOW_STRAGGLER=0 or on one rank.
  uint64_t arrivalOps = 0;
  uint64_t bytesSent() const;
  uint64_t bytesReceived() const;
  // Of bytesSent(): to peers on other hosts (PeerStats::sameHost false).
  uint64_t networkBytesSent() const;
};

// Memory pinned for zero-copy transfers (Communicator::registerMemory). The
// registration ends when the handle is destroyed.
class GFLOW_EXPORT MemoryRegistration {
 public:
  virtual ~MemoryRegistration();
  void* data() const { return data_; }
  size_t bytes() const { return bytes_; }

 protected:
  MemoryRegistration(void* data, size_t bytes) : data_(data), bytes_(bytes) {}

 private:
  void* data_;
  size_t bytes_;
};

// One send or receive of Communicator::sendRecv.
struct P2POp {
  enum class Kind : uint8_t { kSend, kRecv };
  Kind kind = Kind::kSend;
  Tensor tensor;  // send: read; receive: written
  // The other rank; a receive may take kAnySource.
  int peer = 0;
  int tag = 0;  // >= 0
  // Receives: where the sending rank is written once the op completes (may
  // be null; must stay valid until then).
  int* source = nullptr;

  static constexpr int kAnySource = -1;
  static P2POp send(Tensor t, int peer, int tag = 0) {
    return {Kind::kSend, t, peer, tag, nullptr};
  }
  static P2POp recv(Tensor t, int peer, int tag = 0, int* source = nullptr) {
    return {Kind::kRecv, t, peer, tag, source};
  }
};

class GFLOW_EXPORT Communicator {
 public:
  // Creates the world communicator. Collective: every rank must call it.
  static std::shared_ptr<Communicator> create(const Options& options = Options{});

  virtual ~Communicator();
  Communicator(const Communicator&) = delete;
  Communicator& operator=(const Communicator&) = delete;

  int rank() const;
  int size() const;
  // Host grouping, learned at creation from every rank's host identity
  // (hostname + boot id, or GFLOW_HOST_ID). Hosts are numbered in the order
  // of their lowest rank; local ranks in rank order within a host.
  int localRank() const;
  int localSize() const;
  int hostIndex() const;
  int numHosts() const;

  // In-place: reduces `inout` across ranks.
  void allreduce(Tensor inout, ReduceOp op = ReduceOp::kSum);
  // In-place, with wire compression and scaling; reports inf/NaN.
  AllreduceResult allreduce(Tensor inout, const AllreduceOptions& options);
  // Out-of-place: `in` is left untouched; `out` has the same count and dtype.
  void allreduce(Tensor in, Tensor out, ReduceOp op = ReduceOp::kSum);
  // in.count == out.count * size(); rank r receives block r of the result.
  void reduceScatter(Tensor in, Tensor out, ReduceOp op = ReduceOp::kSum);
  // out.count == in.count * size(); block r of out is rank r's in.
  void allgather(Tensor in, Tensor out);
  void broadcast(Tensor inout, int root);
  void barrier();

  // Rooted ops. Only the root's result (reduce, gather) or source (scatter)
  // buffer is used: on other ranks it is neither checked nor touched and
  // may be an empty Tensor. `in` is never written.
  // The reduction of every rank's `in` lands in the root's `out` (same
  // count and dtype; `out` may be `in`). Every rank gets the same bits as
  // any other run of the same op on the same inputs.
  void reduce(Tensor in, Tensor out, int root, ReduceOp op = ReduceOp::kSum);
  // In place on the root; the other ranks' `inout` is left as it was.
  void reduce(Tensor inout, int root, ReduceOp op = ReduceOp::kSum);
  // Root: out.count == in.count * size(); block r of out is rank r's in
  // (in may be the root's own block of out).
  void gather(Tensor in, Tensor out, int root);
  // Root: in.count == out.count * size(); rank r receives block r of the
  // root's in (out may be the root's own block of in).
  void scatter(Tensor in, Tensor out, int root);
  // in.count == out.count, a multiple of size(); block j of in (count /
  // size() elements) goes to rank j, block j of out comes from rank j. in
  // and out must not overlap.
  void alltoall(Tensor in, Tensor out);

  // Uneven (v) forms; counts and offsets are in elements, one per rank.
  // Every rank passes the same `counts` (kMismatch otherwise), except for
  // alltoallv, where each rank passes its own. They run over the network
  // transport (shared memory has no uneven forms).
  // out.count == sum(counts); rank r's `in` (counts[r] elements) lands at
  // sum(counts[0..r)) of every rank's `out`.
  void allgatherv(Tensor in, Tensor out, const std::vector<size_t>& counts);
  // The same into the root's `out` only (other ranks' `out` is not used).
  void gatherv(Tensor in, Tensor out, const std::vector<size_t>& counts, int root);
  // Root: in.count == sum(counts); rank r receives counts[r] elements from
  // sum(counts[0..r)) of the root's `in` (other ranks' `in` is not used).
  void scatterv(Tensor in, Tensor out, const std::vector<size_t>& counts, int root);
  // in.count == sum(counts); rank r receives the reduction of every rank's
  // counts[r] elements at sum(counts[0..r)) (out.count == counts[r]). Runs
  // as one allreduce of `in` through host scratch memory, then a copy: every
  // allreduce path applies, and Stats counts it as an allreduce. Host
  // tensors only.
  void reduceScatterv(Tensor in, Tensor out, const std::vector<size_t>& counts,
                      ReduceOp op = ReduceOp::kSum);
  // inCounts[j] elements at inOffsets[j] of `in` go to rank j; outCounts[j]
  // elements from rank j land at outOffsets[j] of `out`. Each block inside
  // its tensor, the blocks of `out` disjoint, in and out disjoint, and
  // inCounts[rank()] == outCounts[rank()]. A block whose count differs from
  // what its receiver expects raises kMismatch on every rank.
  void alltoallv(Tensor in, const std::vector<size_t>& inCounts,
                 const std::vector<size_t>& inOffsets, Tensor out,
                 const std::vector<size_t>& outCounts, const std::vector<size_t>& outOffsets);

  // Point-to-point. Only the two ranks of a message take part, and these
  // calls stand outside the collectives' order: a rank may run any number
  // of them between two collectives. They are posted in this rank's issue
  // order with its collectives. A blocking call returns when its messages
  // are done; an async one whose messages are not done at once stays in
  // flight while later ops run, and its Work completes when they are (so
  // an async receive posted before this rank's own send does not hold the
  // send back). Between two ranks, messages of one tag are received in the order they
  // were sent (MPI's non-overtaking rule); messages of different tags do not
  // wait for each other. A receive must name the send's dtype and count
  // (kMismatch otherwise, raised on the receiving rank and reported to the
  // sender's next op). A send completes once the transport has taken the
  // data: without a posted receive, up to GFLOW_UNEXPECTED_LIMIT bytes per
  // peer are buffered by the receiver; beyond that it waits for the
  // receive, as MPI's rendezvous does, so two ranks that both send large
  // messages to each other with blocking calls first use sendRecv (or the
  // async forms). A receive from any source claims a message only when one
  // arrives; until then, a later receive naming a rank takes that rank's
  // messages in order (in MPI the earlier any-source receive would match
  // first). A peer that never matches
  // raises kTimeout naming it by the deadline; a dead peer kPeerLost.
  // `peer`: another rank (not this one); `tag` >= 0.
  void send(Tensor in, int peer, int tag = 0);
  // Returns the rank the message came from (`peer`, or the matched rank
  // for P2POp::kAnySource: the first rank whose message of `tag` arrives).
  int recv(Tensor out, int peer, int tag = 0);
  // Posts every message of `ops` at once, then waits for all of them (so
  // exchanges of any size cannot deadlock, like NCCL's grouped
  // ncclSend/ncclRecv or torch's batch_isend_irecv). Receive buffers must
  // not overlap any other buffer of the call.
  void sendRecv(const std::vector<P2POp>& ops);

  Work allreduceAsync(Tensor inout, ReduceOp op = ReduceOp::kSum);
  Work allreduceAsync(Tensor inout, const AllreduceOptions& options);
  Work allreduceAsync(Tensor in, Tensor out, ReduceOp op = ReduceOp::kSum);
  Work reduceScatterAsync(Tensor in, Tensor out, ReduceOp op = ReduceOp::kSum);
  Work allgatherAsync(Tensor in, Tensor out);
  Work broadcastAsync(Tensor inout, int root);
  Work barrierAsync();
  Work reduceAsync(Tensor in, Tensor out, int root, ReduceOp op = ReduceOp::kSum);
  Work reduceAsync(Tensor inout, int root, ReduceOp op = ReduceOp::kSum);
  Work gatherAsync(Tensor in, Tensor out, int root);
  Work scatterAsync(Tensor in, Tensor out, int root);
  Work alltoallAsync(Tensor in, Tensor out);
  Work allgathervAsync(Tensor in, Tensor out, const std::vector<size_t>& counts);
  Work gathervAsync(Tensor in, Tensor out, const std::vector<size_t>& counts, int root);
  Work scattervAsync(Tensor in, Tensor out, const std::vector<size_t>& counts, int root);
  Work reduceScattervAsync(Tensor in, Tensor out, const std::vector<size_t>& counts,
                           ReduceOp op = ReduceOp::kSum);
  Work alltoallvAsync(Tensor in, const std::vector<size_t>& inCounts,
                      const std::vector<size_t>& inOffsets, Tensor out,
                      const std::vector<size_t>& outCounts, const std::vector<size_t>& outOffsets);
  Work sendAsync(Tensor in, int peer, int tag = 0);
  // `source` (may be null): the sending rank, written when the op completes.
  Work recvAsync(Tensor out, int peer, int tag = 0, int* source = nullptr);
  Work sendRecvAsync(const std::vector<P2POp>& ops);

  // Collective over this communicator: ranks with the same color form a new
  // communicator, ordered by (key, rank). A negative color returns nullptr
  // for that rank.
  std::shared_ptr<Communicator> split(int color, int key);
  // Collective: the ranks of this rank's host (ordered by rank), via split().
  std::shared_ptr<Communicator> localCommunicator();
  // Collective: the ranks with this rank's local rank, one per host (ordered
  // by host index), via split().
  std::shared_ptr<Communicator> crossHostCommunicator();

  // After a lost rank: a new communicator over the survivors, ranks
  // renumbered in their order here (docs/elastic.md). Collective over the
  // survivors only. shrink() drops the rank this communicator's failure
  // verdict names (error()->peer(), which the survivors normally share);
  // shrink(exclude) drops exactly `exclude`, which every survivor must pass
  // alike (e.g. the culprit of a failure on another communicator, such as a
  // GradientReducer's: its ranks are numbered as the communicator it was
  // made from).
  // This communicator is left as it is: failed (an op that was in flight
  // raised the verdict's error), or, under the caller's exclusions, healthy
  // (finish or wait its ops first, then drop it); the new one is built through the
  // store like split(), with this one's options. The survivors meet at the
  // store and every rank's presence is decided once there, so they end with
  // one membership even if their verdicts differed; a rank that neither
  // comes nor was named is counted out at the deadline, and one lost while
  // the survivors connect is counted out by the next attempt (the last
  // error is raised when none succeeds). Returns nullptr on an excluded
  // rank or one the others counted out (e.g. a stopped rank that resumes).
  std::shared_ptr<Communicator> shrink(const std::vector<int>& exclude = {});

  // Collective over this communicator: admits every process waiting in
  // join() on this job's store, and returns a communicator of this one's
  // ranks (same numbering) followed by the joiners, in the order they
  // arrived; nullptr on every rank when nobody waits. This communicator
  // stays usable, also when grow() fails (a joiner lost while connecting:
  // kTimeout or kPeerLost naming op "grow"). Its cost when nobody waits:
  // two store requests on rank 0 and an 8-byte broadcast.
  std::shared_ptr<Communicator> grow();
  // Joins a running job as a new rank: takes a place in line through the
  // job's store (Options::store, else Options::root or GFLOW_ROOT, with the
  // job token), waits until the job's ranks call grow(), and returns the
  // grown communicator. Options other than the identity are those of
  // create() and must match the job's (checked as at creation). Throws
  // kTimeout when no grow() admits it within the timeout (it then withdraws
  // from the line, so no later grow() waits for it), kUnauthorized without
  // the job's token.
  static std::shared_ptr<Communicator> join(const Options& options = Options{});

  // Fails every pending and future op with Error(kAborted). Safe from any
  // thread, including a signal-free watchdog thread; returns immediately.
  void abort();

  // Per-peer traffic and op counts since creation.
  Stats stats() const;
  // The stragglers of the whole run so far, in one line ("rank 3 was last in
  // 96% of 1200 ops, median skew 14.00 ms"; docs/errors.md); "" when no op
  // has a verdict.
  std::string stragglerSummary() const;

  // Registers [data, data + bytes) with every network transport of this
  // communicator that needs it: the verbs transport pins it once (one
  // ibv_reg_mr per connection context) so that every later op on tensors
  // inside it moves its large messages zero-copy without registering again
  // (small ones are copied through registered slots anyway); without it,
  // verbs registers the op's buffers per op (gflow cannot see memory being
  // freed and re-mapped between ops). TCP and shared memory need nothing.
  // The memory must stay allocated and mapped until the handle is destroyed
  // (destroy it before freeing the memory); ops may run meanwhile. Local
  // (not collective). Throws Error(kInternal) when the device refuses (e.g.
  // the locked-memory limit, ulimit -l).
  std::unique_ptr<MemoryRegistration> registerMemory(void* data, size_t bytes);

  // The error that failed this communicator, or nullptr.
  std::shared_ptr<const Error> error() const;

 protected:
  // The library's communicator derives from this class; users get theirs
  // from create() and split().
  Communicator() = default;
};

}  // namespace gflow
