// Point-to-point through NCCL (GFLOW_NCCL_P2P; docs/backends.md, "NCCL").
//
// A message's header goes through the host backend's point-to-point: it
// matches tags, resolves a receive from any source, and raises kMismatch for
// a receive of another dtype or count, or one that expects the payload
// itself (the header's envelope says "nccl"). Its 8 bytes are the sender's
// NCCL sequence number to that peer. The payload goes through NCCL: once a
// call's headers are done, its sends and receives are one NCCL group on the
// communicator's stream, the receives from each peer in the order the peer
// issued the sends (NCCL matches a pair's sends and receives in issue
// order). Calls enqueue their groups in the order they were made, and before
// any later collective (Router::route calls launchP2P), so a rank's ops
// start in program order and its NCCL stream holds them in that order. A receive that would take a
// peer's messages out of order is refused (kMismatch) rather than handed the wrong payload.
#include <algorithm>
#include <exception>
#include <limits>
#include <string>

#include "backend/nccl/nccl_backend.h"
#include "common/check.h"
#include "cuda/device_guard.h"

namespace gflow::backend {

namespace {

constexpr uint64_t kNoNccl = std::numeric_limits<uint64_t>::max();  // a message of no bytes

size_t payloadBytes(const P2PMessage& m) {
  return m.count * dataTypeSize(m.dtype);
}

}  // namespace

class NcclP2P final : public P2PInFlight {
 public:
  NcclP2P(NcclBackend& nccl, Backend& host, const Op& op, std::vector<P2PMessage> msgs)
      : nccl_(nccl), op_(op), msgs_(std::move(msgs)), seq_(msgs_.size(), kNoNccl) {
    std::vector<P2PMessage> headers = msgs_;
    for (size_t i = 0; i < msgs_.size(); ++i) {
      const P2PMessage& m = msgs_[i];
      if (m.send && payloadBytes(m) > 0) seq_[i] = nccl_.p2pSent_[m.peer]++;
      headers[i].viaNccl = true;
      headers[i].data = &seq_[i];
    }
    headers_ = host.startPointToPoint(op_, std::move(headers));
    nccl_.unlaunched_.push_back(this);
  }

  ~NcclP2P() override {
    auto& q = nccl_.unlaunched_;
    q.erase(std::remove(q.begin(), q.end(), this), q.end());
    if (event_) nccl_.plugin_->eventDestroy(event_);
  }

  bool test() override {
    if (error_) std::rethrow_exception(error_);
    if (!launched_) {
      nccl_.launchP2P(this, op_.deadline.expired());
      if (!launched_) return false;
    }
    cuda::DeviceGuard g(*nccl_.plugin_, nccl_.device_);
    return nccl_.passed(op_, event_, op_.deadline, what_.c_str(), &poll_);
  }

  void wait() override {
    if (error_) std::rethrow_exception(error_);
    nccl_.launchP2P(this, true);
    if (error_) std::rethrow_exception(error_);
    cuda::DeviceGuard g(*nccl_.plugin_, nccl_.device_);
    nccl_.await(op_, event_, what_.c_str());
  }

  const std::vector<P2PMessage>& messages() const override { return msgs_; }

  // Whether every header is done (drives them once without blocking).
  bool headersDone() { return headers_->test(); }
  void awaitHeaders() { headers_->wait(); }

  // The headers are done (this call was unlaunched_'s front): enqueues the
  // NCCL group. A failure is this call's error too, raised by its own
  // test() and wait() whichever op launched it.
  void launch() {
    try {
      enqueue();
    } catch (...) {
      error_ = std::current_exception();
      throw;
    }
  }

 private:
  void enqueue() {
    const std::vector<P2PMessage>& got = headers_->messages();
    std::vector<NcclBackend::Transfer> sends, recvs;
    std::vector<size_t> order;  // receives with a payload, by (source, sequence)
    for (size_t i = 0; i < msgs_.size(); ++i) {
      P2PMessage& m = msgs_[i];
      if (m.send) {
        if (payloadBytes(m) > 0) sends.push_back({m.peer, m.data, payloadBytes(m)});
        continue;
      }
      m.source = got[i].source;
      if (payloadBytes(m) > 0) order.push_back(i);
    }
    std::sort(order.begin(), order.end(), [&](size_t a, size_t b) {
      return std::make_pair(msgs_[a].source, seq_[a]) < std::make_pair(msgs_[b].source, seq_[b]);
    });
    std::vector<uint64_t> next = nccl_.p2pReceived_;  // committed once all are in order
    for (size_t i : order) {
      const P2PMessage& m = msgs_[i];
      if (seq_[i] != next[m.source]) outOfOrder(m, seq_[i], next[m.source]);
      ++next[m.source];
      recvs.push_back({m.source, m.data, payloadBytes(m)});
    }
    nccl_.p2pReceived_ = std::move(next);
    what_ = describe();
    cuda::DeviceGuard g(*nccl_.plugin_, nccl_.device_);
    nccl_.enqueueGroup(op_, sends, recvs);
    if (int e = nccl_.plugin_->eventCreate(&event_)) {
      nccl_.failCuda(op_, e, "creating a point-to-point event");
    }
    if (int e = nccl_.plugin_->eventRecord(event_, nccl_.stream_)) {
      nccl_.failCuda(op_, e, "recording an event after the NCCL point-to-point group");
    }
    launched_ = true;
  }

  // What a timeout names: the call's transfers and their peers.
  std::string describe() const {
    std::string out = "the NCCL transfers of a point-to-point call (";
    size_t shown = 0;
    for (const P2PMessage& m : msgs_) {
      if (payloadBytes(m) == 0) continue;
      if (shown++ == 3) {
        out += ", ...";
        break;
      }
      out += std::string(shown > 1 ? ", " : "") +
             (m.send ? "its send to rank " : "its receive from rank ") +
             std::to_string(m.send ? m.peer : m.source) + " (tag " + std::to_string(m.tag) + ")";
    }
    return out + ")";
  }

  [[noreturn]] void outOfOrder(const P2PMessage& m, uint64_t seq, uint64_t next) const {
    GFLOW_THROW(kMismatch, ErrorContext().withRank(nccl_.s_.rank).withPeer(m.source))
        << "this receive (tag " << m.tag << ") matched rank " << m.source << "'s device message #"
        << seq << " while its message #" << next
        << " is not received yet: through NCCL (GFLOW_NCCL_P2P) a rank's device messages are "
           "received in the order it sent them (post the receives in that order, or in one "
           "sendRecv call)";
  }

  NcclBackend& nccl_;
  const Op op_;
  std::vector<P2PMessage> msgs_;
  std::vector<uint64_t> seq_;  // per message: its NCCL sequence number (sent or received)
  std::unique_ptr<P2PInFlight> headers_;
  void* event_ = nullptr;
  bool launched_ = false;
  std::exception_ptr error_;  // launch()'s failure
  std::string what_;          // describe(), once launched
  std::chrono::steady_clock::time_point poll_ = std::chrono::steady_clock::now();
};

std::unique_ptr<P2PInFlight> NcclBackend::startNcclPointToPoint(const Op& op,
                                                                std::vector<P2PMessage> msgs,
                                                                Backend& host) {
  GFLOW_ENFORCE(state_ == State::kNccl);
  if (p2pSent_.empty()) {
    p2pSent_.assign(size_t(s_.size), 0);
    p2pReceived_.assign(size_t(s_.size), 0);
  }
  return std::make_unique<NcclP2P>(*this, host, op, std::move(msgs));
}

void NcclBackend::launchP2P(const NcclP2P* until, bool block) {
  if (until && std::find(unlaunched_.begin(), unlaunched_.end(), until) == unlaunched_.end()) {
    return;  // launched already
  }
  bool reached = false;
  while (!unlaunched_.empty() && !reached) {
    NcclP2P* p = unlaunched_.front();
    reached = p == until;
    if (block) {
      p->awaitHeaders();
    } else if (!p->headersDone()) {
      return;
    }
    unlaunched_.pop_front();
    p->launch();
  }
}

}  // namespace gflow::backend
