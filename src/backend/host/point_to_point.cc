// Point-to-point messages over the network transport
// (Backend::startPointToPoint).
// A message's tag is (kPointToPointGroup | the caller's tag, its number among
// the pair's messages of that tag in that direction), so both sides number
// them alike and messages of one tag match in the order they were posted.
// Every message of an op is posted at once, and the op stays in flight until
// all are done (P2PInFlight); a receive from any source is posted for the
// first rank whose next message of its tag has arrived.
#include <algorithm>
#include <chrono>
#include <thread>

#include "backend/host/exchange.h"
#include "common/check.h"
#include "transport/contract.h"

namespace gflow::backend::host {

uint64_t P2POrder::key(bool send, int peer, int tag) {
  return uint64_t(static_cast<uint32_t>(tag)) << 32 | uint64_t(static_cast<uint32_t>(peer)) << 1 |
         (send ? 1 : 0);
}

uint64_t P2POrder::peek(bool send, int peer, int tag) const {
  auto it = next_.find(key(send, peer, tag));
  return it == next_.end() ? 0 : it->second;
}

uint64_t P2POrder::take(bool send, int peer, int tag) {
  return next_[key(send, peer, tag)]++;
}

namespace {

transport::Tag tagOf(int tag, uint64_t number) {
  return transport::Tag{transport::kPointToPointGroup | static_cast<uint32_t>(tag), number};
}

size_t bytesOf(const P2PMessage& m) {
  return m.viaNccl ? sizeof(uint64_t) : m.count * dataTypeSize(m.dtype);
}

transport::RequestPtr post(transport::Context& ctx, P2POrder& order, P2PMessage& m, int peer) {
  // The header of a message whose payload travels through NCCL says so.
  const Route route{m.viaNccl ? Path::kNccl : Path::kNetwork, Algorithm::kDirect};
  const OpDesc d{OpKind::kPointToPoint, m.dtype, ReduceOp::kSum, route, 0, m.count};
  const transport::Envelope env = encode(d);
  const transport::Tag tag = tagOf(m.tag, order.take(m.send, peer, m.tag));
  if (m.send) return ctx.isend(peer, m.data, bytesOf(m), tag, env);
  m.source = peer;
  return ctx.irecv(peer, m.data, bytesOf(m), tag, env);
}

// The first rank (from the next one up) whose next message of `tag` has
// arrived, or -1.
int arrivedFrom(transport::Context& ctx, const P2POrder& order, int tag) {
  const int n = ctx.size(), me = ctx.rank();
  for (int i = 1; i < n; ++i) {
    const int peer = (me + i) % n;
    if (ctx.arrived(peer, tagOf(tag, order.peek(false, peer, tag)))) return peer;
  }
  return -1;
}

// Drives progress until some rank's message of `tag` has arrived, or the
// deadline passes.
int awaitAnySource(transport::Context& ctx, const Op& op, const P2POrder& order, int tag) {
  for (int idle = 0;; ++idle) {
    const int peer = arrivedFrom(ctx, order, tag);
    if (peer >= 0) return peer;
    if (op.deadline.expired()) {
      GFLOW_THROW(kTimeout, ErrorContext().withSeq(op.seq).withRank(ctx.rank()))
          << "Timed out receiving from any source with tag " << tag
          << ": no rank sent a matching message within the deadline (GFLOW_TIMEOUT)";
    }
    ctx.poll();
    // Spin briefly, then sleep up to 1 ms between polls.
    if (idle > 64) {
      std::this_thread::sleep_for(std::chrono::microseconds(std::min(1000, 10 * (idle - 64))));
    }
  }
}

// A timeout names what the peer did not do (the transport's text speaks of
// collectives).
[[noreturn]] void timedOut(const Error& e, const Op& op, const P2PMessage& m) {
  const int peer = m.send ? m.peer : m.source;
  throw Error(e.code(),
              e.detail() + "; the message is a " + (m.send ? "send" : "receive") + " with tag " +
                  std::to_string(m.tag) + " that rank " + std::to_string(peer) +
                  " has not matched with a " + (m.send ? "receive" : "send"),
              e.context().withSeq(op.seq));
}

// The messages of one op, posted at construction (receives from any source
// once a message for them arrives).
class Direct final : public P2PInFlight {
 public:
  Direct(transport::Context& ctx, const Op& op, P2POrder& order, std::vector<P2PMessage> msgs)
      : ctx_(ctx), op_(op), order_(order), msgs_(std::move(msgs)), reqs_(msgs_.size()) {
    // Receives first, so that a peer's data finds its buffer rather than
    // being staged while this rank's sends go out.
    for (bool sends : {false, true}) {
      for (size_t i = 0; i < msgs_.size(); ++i) {
        if (msgs_[i].send == sends && msgs_[i].peer != P2PMessage::kAnySource) {
          reqs_[i] = post(ctx_, order_, msgs_[i], msgs_[i].peer);
        }
      }
    }
  }

  bool test() override {
    if (op_.deadline.expired()) {
      wait();
      return true;
    }
    ctx_.poll();
    bool done = true;
    for (size_t i = 0; i < msgs_.size(); ++i) {
      if (!reqs_[i]) {
        const int peer = arrivedFrom(ctx_, order_, msgs_[i].tag);
        if (peer < 0) {
          done = false;
          continue;
        }
        reqs_[i] = post(ctx_, order_, msgs_[i], peer);
      }
      // One poll above drove every request; a failed one raises its error.
      if (reqs_[i]->failed()) throw reqs_[i]->error();
      done = reqs_[i]->done() && done;
    }
    if (done) ctx_.endOp();
    return done;
  }

  void wait() override {
    for (size_t i = 0; i < msgs_.size(); ++i) {
      if (!reqs_[i]) {
        reqs_[i] = post(ctx_, order_, msgs_[i], awaitAnySource(ctx_, op_, order_, msgs_[i].tag));
      }
    }
    for (size_t i = 0; i < msgs_.size(); ++i) {
      try {
        ctx_.wait(reqs_[i], op_.deadline);
      } catch (const Error& e) {
        if (e.code() != ErrorCode::kTimeout) throw;
        timedOut(e, op_, msgs_[i]);
      }
    }
    ctx_.endOp();
  }

  const std::vector<P2PMessage>& messages() const override { return msgs_; }

 private:
  transport::Context& ctx_;
  const Op op_;
  P2POrder& order_;
  std::vector<P2PMessage> msgs_;
  std::vector<transport::RequestPtr> reqs_;  // null: from any source, not yet posted
};

}  // namespace

std::unique_ptr<P2PInFlight> startPointToPointDirect(transport::Context& ctx, const Op& op,
                                                     P2POrder& order,
                                                     std::vector<P2PMessage> msgs) {
  return std::make_unique<Direct>(ctx, op, order, std::move(msgs));
}

}  // namespace gflow::backend::host
