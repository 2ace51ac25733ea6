// Exchange: what an algorithm sees of the transport during one op. It stamps
// every message with the op's tag group and envelope and waits against the
// op's deadline, so algorithms only say who, what and which message index.
#pragma once

#include <unordered_map>
#include <vector>

#include "backend/backend.h"
#include "transport/transport.h"

namespace gflow::backend::host {

// Tuning shared by the ring algorithms (Options::tuning.pieceBytes and
// ringWindow, else GFLOW_PIECE_BYTES, GFLOW_RING_WINDOW), fixed per backend.
struct RingTuning {
  size_t pieceBytes;
  size_t window;  // pieces per segment per round
};
RingTuning ringTuning(const TuningOptions& given);

class Exchange {
 public:
  Exchange(transport::Context& ctx, const Op& op, const RingTuning& tuning)
      : ctx_(ctx), op_(op), tuning_(tuning), env_(encode(op.desc)) {
    ctx_.beginGroup(op.seq, env_);
  }

  int rank() const { return ctx_.rank(); }
  int size() const { return ctx_.size(); }
  const OpDesc& desc() const { return op_.desc; }
  const RingTuning& tuning() const { return tuning_; }

  transport::RequestPtr send(int peer, const void* data, size_t bytes, uint64_t index) {
    auto r = ctx_.isend(peer, data, bytes, transport::Tag{op_.seq, index}, env_);
    pendingSends_.push_back(r);
    return r;
  }
  transport::RequestPtr recv(int peer, void* data, size_t bytes, uint64_t index) {
    return ctx_.irecv(peer, data, bytes, transport::Tag{op_.seq, index}, env_);
  }
  void wait(const transport::RequestPtr& r) { ctx_.wait(r, op_.deadline); }
  // The algorithm posts every receive before its first send
  // (transport::Context::receivesPostedFirst).
  void receivesPostedFirst() { ctx_.receivesPostedFirst(); }

  // Waits for every send posted so far (the caller's buffers may be reused
  // once this returns).
  void waitSends() {
    for (auto& r : pendingSends_) ctx_.wait(r, op_.deadline);
    pendingSends_.clear();
  }

  ~Exchange() = default;

 private:
  transport::Context& ctx_;
  const Op& op_;
  const RingTuning& tuning_;
  transport::Envelope env_;
  std::vector<transport::RequestPtr> pendingSends_;
};

// Growable scratch memory owned by the backend, reused across ops. It is
// registered with the transport (RDMA: once, not per op) for as long as it
// lives at one address; growing it drops the old registration first.
class Scratch {
 public:
  explicit Scratch(transport::Context& ctx) : ctx_(ctx) {}
  char* get(size_t bytes) {
    if (buf_.size() < bytes) {
      region_.reset();
      buf_.resize(bytes);
      region_ = ctx_.registerMemory(buf_.data(), buf_.size());
    }
    return buf_.data();
  }

 private:
  transport::Context& ctx_;
  std::vector<char> buf_;
  std::unique_ptr<transport::MemoryRegion> region_;  // before buf_ goes
};

// Message index layout: round (24 bits) | step (20 bits) | piece (20 bits).
// Algorithms keep the pieces of one step below kMaxPieces by enlarging them.
constexpr size_t kMaxPieces = size_t(1) << 19;
inline uint64_t messageIndex(uint64_t round, uint64_t step, uint64_t piece) {
  return round << 40 | step << 20 | piece;
}

// The roll call of a rooted op (reduce, gather, scatter), which makes every
// rank see a disagreement about the op, whatever the algorithm's message
// pattern: a rank that only sends could otherwise return before the
// message that shows the mismatch reaches it, and ranks that disagree about
// the root could all wait for data nobody sends. Three empty messages per
// non-root rank, all off the data's critical path:
//   open:  at the start, the root to every rank (a rank that takes itself
//          for the root is heard by everyone);
//   hello: at the start, every rank to the root;
//   close: the root to every rank once every hello has arrived (so no rank
//          returns before the root has heard from every rank).
// A rank returns once its op is done and it has its open and close (the
// root: its hellos). A disagreement fails some rank with kMismatch, which
// tells the others while they still wait.
class RollCall {
 public:
  explicit RollCall(Exchange& ex);
  // Before the op returns.
  void finish();

 private:
  static constexpr uint64_t kOpen = uint64_t(1) << 63, kHello = kOpen + 1, kClose = kOpen + 2;
  Exchange& ex_;
  std::vector<transport::RequestPtr> recvs_;
};

// The order of point-to-point messages: per (direction, peer, tag), the
// number the next message gets. Owned by the backend, kept across ops.
class P2POrder {
 public:
  uint64_t peek(bool send, int peer, int tag) const;
  uint64_t take(bool send, int peer, int tag);  // returns peek's number, then advances

 private:
  static uint64_t key(bool send, int peer, int tag);
  std::unordered_map<uint64_t, uint64_t> next_;
};

// Algorithms (one per file).
void allreduceRing(Exchange& ex, Scratch& scratch, const void* in, void* out);
void allreduceRecursiveDoubling(Exchange& ex, Scratch& scratch, const void* in, void* out);
void allreduceHalvingDoubling(Exchange& ex, Scratch& scratch, const void* in, void* out);
void reduceScatterRing(Exchange& ex, Scratch& scratch, const void* in, void* out);
void allreduceFixedOrder(Exchange& ex, Scratch& scratch, const void* in, void* out);
void reduceScatterFixedOrder(Exchange& ex, Scratch& scratch, const void* in, void* out);
void allgatherRing(Exchange& ex, const void* in, void* out);
void broadcastChain(Exchange& ex, void* buf);
void barrierDissemination(Exchange& ex);
void reduceBinomial(Exchange& ex, Scratch& scratch, const void* in, void* out);
void reduceChain(Exchange& ex, Scratch& scratch, const void* in, void* out);
void gatherBinomial(Exchange& ex, Scratch& scratch, const void* in, void* out);
void gatherLinear(Exchange& ex, const void* in, void* out);
void scatterBinomial(Exchange& ex, Scratch& scratch, const void* in, void* out);
void scatterLinear(Exchange& ex, const void* in, void* out);
void alltoallPairwise(Exchange& ex, const void* in, void* out);
void alltoallvPairwise(Exchange& ex, const void* in, const Blocks& inBlocks, void* out,
                       const Blocks& outBlocks);
void gathervLinear(Exchange& ex, const void* in, void* out, const Blocks& blocks);
void scattervLinear(Exchange& ex, const void* in, const Blocks& blocks, void* out);
std::unique_ptr<P2PInFlight> startPointToPointDirect(transport::Context& ctx, const Op& op,
                                                     P2POrder& order, std::vector<P2PMessage> msgs);

}  // namespace gflow::backend::host
