// Transport: point-to-point messages between the ranks of one communicator.
//
// The contract is the one an RDMA verbs transport can implement (registered
// memory, receiver-advertised buffers, completion polling); the TCP and verbs
// transports implement it (shared memory is not a Transport: the shm backend
// has its own group). What both share above their wire is in engine.h.
// The contract:
//   - isend/irecv post a message of (peer, tag, bytes) and return a Request at
//     once; completion is observed with test() or wait(deadline).
//   - Messages between a pair are matched by tag, never by arrival order, so
//     an algorithm may post receives in any order. Tags are unique per op.
//   - Point-to-point messages (tag groups with kPointToPointGroup set,
//     transport/contract.h) stand outside the op order: beginGroup's checks
//     skip them, and arrived() finds them for a receive from any source.
//   - Every message carries the op's Envelope (what collective, dtype, count,
//     ...). A message whose tag group (op sequence number) equals the group of
//     an op this rank is running, but whose envelope differs, fails that op
//     with Error(kMismatch) naming the peer and both envelopes.
//   - Progress is driven by the thread that waits (no wake-up hop on the
//     latency path). Calls other than abort() come from one thread at a time:
//     the communicator's executing thread.
//   - abort() may be called from any thread; it fails every pending request
//     and every later call with the given error and wakes the waiter.
//   - Any failure (peer lost, timeout, mismatch, error reported by a peer) is
//     sticky: the context stays failed with the first error.
#pragma once

#include <atomic>
#include <cstddef>
#include <cstdint>
#include <functional>
#include <memory>
#include <mutex>
#include <optional>
#include <string>
#include <vector>

#include "common/arrivals.h"
#include "common/deadline.h"
#include "gflow/error.h"
#include "gflow/options.h"
#include "gflow/store.h"
#include "gflow/types.h"

namespace gflow::transport {

// Identifies a message within a communicator. `group` is the op sequence
// number; `index` distinguishes the messages of one op between one pair.
struct Tag {
  uint64_t group = 0;
  uint64_t index = 0;
  bool operator==(const Tag& o) const { return group == o.group && index == o.index; }
};

// What op a message belongs to; opaque to the transport, compared for
// equality, described for error messages by a formatter the core installs.
struct Envelope {
  uint64_t words[3] = {0, 0, 0};
  bool operator==(const Envelope& o) const {
    return words[0] == o.words[0] && words[1] == o.words[1] && words[2] == o.words[2];
  }
  bool operator!=(const Envelope& o) const { return !(*this == o); }
};
using EnvelopeFormatter = std::function<std::string(const Envelope&)>;

// Completion of one isend/irecv.
class Request {
 public:
  Request(int peer, bool isSend, size_t bytes) : peer_(peer), isSend_(isSend), bytes_(bytes) {}

  bool done() const { return state_.load(std::memory_order_acquire) != kPending; }
  bool failed() const { return state_.load(std::memory_order_acquire) == kFailed; }
  int peer() const { return peer_; }
  bool isSend() const { return isSend_; }
  size_t bytes() const { return bytes_; }
  // Valid once failed().
  const Error& error() const { return *error_; }

  // Used by transports.
  void complete() { state_.store(kOk, std::memory_order_release); }
  void fail(const Error& e) {
    if (done()) return;
    error_.emplace(e);
    state_.store(kFailed, std::memory_order_release);
  }

 private:
  enum : int { kPending = 0, kOk = 1, kFailed = 2 };
  std::atomic<int> state_{kPending};
  int peer_;
  bool isSend_;
  size_t bytes_;
  std::optional<Error> error_;
};
using RequestPtr = std::shared_ptr<Request>;

// Memory registered with the transport. TCP needs none (the handle is empty);
// verbs pins pages and records lkey/rkey.
class MemoryRegion {
 public:
  virtual ~MemoryRegion() = default;
  void* data() const { return data_; }
  size_t size() const { return size_; }

 protected:
  MemoryRegion(void* data, size_t size) : data_(data), size_(size) {}

 private:
  void* data_;
  size_t size_;
};

struct ContextOptions {
  int rank = 0;
  int size = 1;
  std::shared_ptr<Store> store;
  std::string prefix;  // store keys of this communicator live under it
  std::string token;
  std::chrono::milliseconds timeout{300000};
  // Ranks of the job that share this host's cpus (the waiting policy,
  // transport/wait_policy.h); -1: unknown, taken as `size`.
  int ranksOnHost = -1;
  // Single copy between the ranks of one host (tcp: GFLOW_LOCAL_SINGLE_COPY,
  // tcp_context.h): allowed at all (off under GFLOW_SHM=0), and this rank's
  // host identity, which a peer's must equal.
  bool localSingleCopy = false;
  uint64_t hostHash = 0;
  // Who reached each collective last (common/arrivals.h): the stamps of
  // sent messages and the arrivals of received ones; null: none.
  std::shared_ptr<Arrivals> arrivals;
  std::vector<int> arrivalRanks;  // peer -> the Arrivals' rank; empty: the same
  // Fields left unset come from the environment (gflow/options.h).
  std::string connect;  // Options::connect (transport/connect_mode.h)
  TcpOptions tcp;
  VerbsOptions verbs;
  ProgressOptions progress;  // unexpectedLimitBytes and spinUs
};

class Context {
 public:
  virtual ~Context() = default;

  int rank() const { return rank_; }
  int size() const { return size_; }

  // Registers memory for zero-copy transfers; may return a trivial region.
  virtual std::unique_ptr<MemoryRegion> registerMemory(void* data, size_t size) = 0;

  // Posts a message. The buffer must stay valid and unchanged (send) or
  // untouched (recv) until the request completes. `bytes` may be 0. Throws the
  // context's error if it has failed.
  virtual RequestPtr isend(int peer, const void* data, size_t bytes, Tag tag,
                           const Envelope& env) = 0;
  virtual RequestPtr irecv(int peer, void* data, size_t bytes, Tag tag, const Envelope& env) = 0;

  // Declares that this rank now runs op `group` with envelope `env`: messages
  // of that group from any peer must carry `env`. Messages of an earlier
  // group that no receive matched are a mismatch too.
  virtual void beginGroup(uint64_t group, const Envelope& env) = 0;
  // The op begun last posts its receives ahead of the sends they match
  // (the all-to-all: every receive before its first send; reproducible
  // mode's fixed order: each round's receives before its sends). Every
  // rank of the op says so alike, after beginGroup and before posting any
  // of the op's messages (the sender's choice to hold and the receiver's
  // CLEAR sent ahead must agree). A wire may then hold its large messages
  // until their receive is posted from the size it uses for point-to-point
  // (TCP: GFLOW_RENDEZVOUS rather than 16 times that): the receiver's
  // CLEAR is on its way before the sender gets there, so holding costs no
  // round trip, and a sender ahead of its receiver no longer streams data
  // that is staged and copied again. A receive posted after its sender got
  // there still matches: the held message waits for it.
  virtual void receivesPostedFirst() {}

  // Whether a message of `tag` from `peer` has arrived (or been announced)
  // with no receive posted for it yet. Owning thread.
  virtual bool arrived(int peer, Tag tag) = 0;
  // The end of an op that ran without beginGroup (point-to-point): what the
  // wire kept for the op's buffers goes (verbs: per-op registrations).
  virtual void endOp() {}

  // Drives progress until `req` completes; throws the request's or the
  // context's error, or Error(kTimeout) naming the peer when the deadline
  // passes (which fails the context).
  virtual void wait(const RequestPtr& req, Deadline deadline) = 0;
  // Drives progress once without blocking; true if `req` has completed.
  virtual bool test(const RequestPtr& req) = 0;
  // Drives progress once without blocking, which answers the peers' liveness
  // probes (transport/liveness.h); throws the context's error.
  virtual void poll() = 0;

  // Tells every peer that this rank will not run op `group` (its call was
  // rejected for invalid arguments, `why`), without failing this context: a
  // peer that runs that op fails with kMismatch now or when it starts it,
  // and one that rejected it too forgets the notice. Owning thread; never
  // throws (a peer it cannot reach learns of it from the op that follows).
  virtual void reject(uint64_t group, const std::string& why) = 0;
  // Fails the context (see the header comment). Thread-safe.
  virtual void abort(const Error& error) = 0;
  // Best-effort: tells every peer that this rank failed with `error`, so they
  // fail with it instead of waiting for a timeout. Never throws.
  virtual void notifyPeers(const Error& error) = 0;
  // After this context failed: the failure report (notifyPeers) each peer
  // sent, the first of each, once every peer but `exclude` has reported or
  // is gone, or at `until`. Owning thread; never throws. Without a way to
  // read reports after failing, those it has (the default: none).
  virtual std::vector<Error> awaitReports(Deadline until, int exclude) {
    (void)until;
    (void)exclude;
    return {};
  }
  // The error that failed this context, if any. Thread-safe.
  virtual std::shared_ptr<const Error> error() const = 0;

  // Traffic counters (thread-safe snapshots).
  virtual PeerStats peerStats(int peer) const = 0;

  void setEnvelopeFormatter(EnvelopeFormatter f) { formatter_ = std::move(f); }
  // `hook` runs on the waiting thread while a wait sleeps, at least every
  // half probe grace: a transport used in turn with this one by the same op
  // (the two phases of a hierarchical op) answers its probes meanwhile.
  // Set before the first op.
  void setWhileWaiting(std::function<void()> hook) { whileWaiting_ = std::move(hook); }

 protected:
  Context(int rank, int size) : rank_(rank), size_(size) {}
  std::string describe(const Envelope& e) const {
    return formatter_ ? formatter_(e) : std::string("<op>");
  }
  void whileWaiting() const {
    if (whileWaiting_) whileWaiting_();
  }

 private:
  int rank_;
  int size_;
  EnvelopeFormatter formatter_;
  std::function<void()> whileWaiting_;
};

// Creates and connects a context of the named transport ("tcp", "verbs"). Collective
// over every rank of the communicator. Throws kInvalidArgument for an unknown
// or unavailable transport.
std::unique_ptr<Context> createContext(const std::string& transport, const ContextOptions& options);

}  // namespace gflow::transport
