// A Backend that runs nothing and records what reaches it, for the tests of
// the backends that compose others (router, hierarchical): which part got
// which op, with what description and buffers, and whether abort,
// notifyPeers and registerMemory arrived. Single-threaded, like the
// executing thread that drives a composition.
#pragma once

#include <functional>
#include <memory>
#include <string>
#include <vector>

#include "backend/backend.h"

namespace gflow::testing {

// What reached one fake backend. Shared with the test, since the
// composition under test owns the backend.
struct Seen {
  struct Call {
    backend::OpKind kind;
    uint64_t seq;
    backend::OpDesc desc;
    const void* in;
    const void* out;
  };
  std::vector<Call> calls;
  std::vector<std::string> aborted;   // the errors' details
  std::vector<std::string> notified;  // the errors' details
  int registered = 0;
  // Runs on every op after it is recorded; may throw to fail the op.
  std::function<void(const backend::Op&)> onOp;
};

// Traffic counters with distinct fields: base, 2 base, 3 base, 4 base.
inline PeerStats fakeStats(uint64_t base) {
  PeerStats s;
  s.bytesSent = base;
  s.bytesReceived = base * 2;
  s.messagesSent = base * 3;
  s.messagesReceived = base * 4;
  return s;
}

class FakeBackend final : public backend::Backend {
 public:
  // peerStats(peer) answers `stats` with `peer` added to bytesSent, so a
  // test sees which peer index reached this part.
  FakeBackend(std::shared_ptr<Seen> seen, PeerStats stats)
      : seen_(std::move(seen)), stats_(stats) {}

  void allreduce(const backend::Op& op, const void* in, void* out) override { record(op, in, out); }
  void reduceScatter(const backend::Op& op, const void* in, void* out) override {
    record(op, in, out);
  }
  void allgather(const backend::Op& op, const void* in, void* out) override { record(op, in, out); }
  void broadcast(const backend::Op& op, void* buf) override { record(op, buf, buf); }
  void barrier(const backend::Op& op) override { record(op, nullptr, nullptr); }
  void reduce(const backend::Op& op, const void* in, void* out) override { record(op, in, out); }
  void gather(const backend::Op& op, const void* in, void* out) override { record(op, in, out); }
  void scatter(const backend::Op& op, const void* in, void* out) override { record(op, in, out); }
  void alltoall(const backend::Op& op, const void* in, void* out) override { record(op, in, out); }
  void alltoallv(const backend::Op& op, const void* in, const backend::Blocks&, void* out,
                 const backend::Blocks&) override {
    record(op, in, out);
  }
  void gatherv(const backend::Op& op, const void* in, void* out, const backend::Blocks&) override {
    record(op, in, out);
  }
  void scatterv(const backend::Op& op, const void* in, const backend::Blocks&, void* out) override {
    record(op, in, out);
  }
  std::unique_ptr<backend::P2PInFlight> startPointToPoint(
      const backend::Op& op, std::vector<backend::P2PMessage> msgs) override {
    record(op, msgs.empty() ? nullptr : msgs[0].data, msgs.empty() ? nullptr : msgs[0].data);
    return nullptr;  // the router tests only look at where the op went
  }
  const char* name() const override { return "fake"; }

  void abort(const Error& e) override { seen_->aborted.push_back(e.detail()); }
  void notifyPeers(const Error& e) override { seen_->notified.push_back(e.detail()); }
  PeerStats peerStats(int peer) const override {
    PeerStats s = stats_;
    s.bytesSent += static_cast<uint64_t>(peer);
    return s;
  }
  void registerMemory(void*, size_t,
                      std::vector<std::unique_ptr<transport::MemoryRegion>>*) override {
    ++seen_->registered;
  }

 private:
  void record(const backend::Op& op, const void* in, const void* out) {
    seen_->calls.push_back({op.desc.kind, op.seq, op.desc, in, out});
    if (seen_->onOp) seen_->onOp(op);
  }

  std::shared_ptr<Seen> seen_;
  PeerStats stats_;
};

}  // namespace gflow::testing
