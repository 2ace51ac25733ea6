// Engine: what the network transports (tcp/, verbs/) share above their wire.
//
//   - The sticky error (common/sticky_error.h): fail() records the first
//     error, fails every posted receive and, through failWire(), every
//     request the wire holds, then throws it. abort() records it from any
//     thread and wakes the waiter (wake()); the owning thread then fails
//     everything pending on its next call (checkFailed()).
//   - Tag matching: per peer, one entry per tag, for a receive posted before
//     its message, or a message that arrived first (unexpected: staged, or
//     announced by the wire). postRecv() matches a receive against an earlier arrival and
//     checks envelope and size; the checks on arrival are checkEnvelope(),
//     checkStale() and checkArrival().
//   - beginGroup(): the op this rank now runs; staged messages of that op
//     must carry its envelope, and none may belong to an op already passed.
//   - Staged-bytes accounting against the unexpected limit (Options::progress,
//     else GFLOW_UNEXPECTED_LIMIT; what the wire
//     does when it is reached is its own: TCP stops reading, verbs fails).
//     Staging buffers come from a pool that keeps freed ones for the next
//     (transport/staging_pool.h).
//   - Deferred peer reports: a peer's error about an op this rank has not
//     reached yet is raised when it gets there.
//   - Rejected ops (Context::reject): a peer's notice that it will not run
//     op k fails this rank if it runs k now or starts it later, and is
//     forgotten once this rank starts a later op (it rejected k too).
//   - Per-peer traffic counters (peerStats) and PONG counts for the liveness
//     probe (transport/liveness.h).
//   - wait()/test(): the request's or the context's error around the wire's
//     progress (pollOnce(), waitUntilDone()).
//   - registerMemory(): a trivial region, for wires that need none (TCP).
//
// Thread safety: as Context. abort(), error() and peerStats() may be called
// from any thread; everything else from the owning (waiting) thread.
#pragma once

#include <atomic>
#include <cstdint>
#include <cstring>
#include <map>
#include <memory>
#include <optional>
#include <unordered_map>
#include <vector>

#include "common/arrivals.h"
#include "common/sticky_error.h"
#include "common/thread_annotations.h"
#include "transport/contract.h"
#include "transport/staging_pool.h"
#include "transport/transport.h"

namespace gflow::transport {

// One message being matched. Wires derive from it for their own state and
// create it in newMessage().
struct Message {
  virtual ~Message() = default;
  Tag tag;
  Envelope env;
  uint64_t len = 0;
  RequestPtr req;                   // null until a receive is posted
  char* user = nullptr;             // the posted buffer
  std::unique_ptr<char[]> staging;  // set while unexpected (arrived first)
  size_t stagingCapacity = 0;       // its size (from the Engine's StagingPool)
  bool charged = false;             // announced: kStagedOverhead counted (announce)
};

class Engine : public Context {
 public:
  // A region that needs no registration (a wire that copies through the
  // kernel, as TCP does, overrides nothing); verbs registers for real.
  std::unique_ptr<MemoryRegion> registerMemory(void* data, size_t size) override;
  void beginGroup(uint64_t group, const Envelope& env) override;
  // The request's own error, or the context's, is thrown around the wire's
  // progress (pollOnce, waitUntilDone).
  void wait(const RequestPtr& req, Deadline deadline) override;
  bool test(const RequestPtr& req) override;
  void poll() override;
  bool arrived(int peer, Tag tag) override;
  void abort(const Error& error) override;
  std::shared_ptr<const Error> error() const override { return error_.get(); }
  PeerStats peerStats(int peer) const override;
  // The reports received so far (a wire that can read on after failing
  // overrides this to wait for the rest).
  std::vector<Error> awaitReports(Deadline until, int exclude) override;

  // Bytes (with kStagedOverhead per message) staged for `peer`: what the
  // unexpected limit bounds. Owning thread only (tests).
  uint64_t stagedBytes(int peer) const { return books_[peer]->stagedBytes; }

 protected:
  explicit Engine(const ContextOptions& options);

  // The owning thread's role: what only it touches is GUARDED_BY(owner_).
  // The Context calls that run on it, and the hooks the wires call from
  // it, take the role on entry; abort(), error() and peerStats() (any
  // thread) do not, so they cannot touch that state.
  ThreadRole owner_;

  // Wire hooks.
  virtual std::unique_ptr<Message> newMessage() = 0;
  // Fails the wire's own pending requests with `first`; must not throw.
  virtual void failWire(const Error& first) = 0;
  // Wakes a waiter sleeping in the wire's progress (any thread).
  virtual void wake() = 0;
  // Drives progress once without blocking.
  virtual void pollOnce() = 0;
  // Drives progress until `req` (pending) completes; past `deadline` runs
  // the liveness probe and fails with failTimeout().
  virtual void waitUntilDone(const RequestPtr& req, Deadline deadline) = 0;

  // Failure.
  [[noreturn]] void fail(const Error& e);
  void checkFailed();  // raises an abort() from another thread
  bool failed() const { return error_.failed(); }
  [[noreturn]] void failTimeout(const RequestPtr& req, bool peerAlive, const char* via);
  // A peer's error report about its op `theirGroup`: kept for the verdict
  // (awaitReports; the first of each peer), and failed now, or deferred
  // until this rank reaches that op. Once failed, only kept. `ownCause`: a
  // failure this rank saw itself in its current op, raised in the report's
  // place (it names the cause; the report may relay its consequence).
  void peerReported(uint64_t theirGroup, const Error& e, const Error* ownCause = nullptr);
  bool reported(int peer) const {
    owner_.enter();
    return reports_.count(peer) != 0;
  }
  // A peer's notice that it will not run op `theirGroup` (Context::reject),
  // as rejectionReport() words it.
  void peerRejected(uint64_t theirGroup, const Error& e);
  // This rank rejects op `group` (the wire's reject calls it first): notices
  // of it and earlier ops are moot from now on, also in a context that
  // never starts an op (its communicator's ops all run elsewhere).
  void selfRejected(uint64_t group);

  // Whether `group` is the op this rank runs and the Arrivals' running op.
  bool inArrivalOp(uint64_t group) const {
    owner_.enter();
    return arrivals_ && groupActive_ && group == group_ && !isPointToPoint(group) &&
           arrivals_->active() && arrivals_->opNumber() == groupOp_;
  }
  // The op this rank runs (beginGroup).
  uint64_t group() const {
    owner_.enter();
    return group_;
  }
  bool groupActive() const {
    owner_.enter();
    return groupActive_;
  }
  std::chrono::milliseconds timeout() const { return timeout_; }
  // Envelope and stale-op checks of beginGroup (for one peer's staged
  // messages), for wires that keep more unexpected state.
  void startGroup(uint64_t group, const Envelope& env);
  void checkStaged(int peer);

  // Matching.
  Message* find(int peer, Tag tag);
  template <class M>
  M* findAs(int peer, Tag tag) {
    return static_cast<M*>(find(peer, tag));
  }
  // A new entry for `tag` (posted, or announced by the wire), not staged.
  Message* add(int peer, Tag tag, const Envelope& env, uint64_t len);
  // irecv: posts `req` on the earlier arrival of `tag` (checked against the
  // receive) or on a new entry. The result is staged if it arrived first.
  Message* postRecv(int peer, Tag tag, const Envelope& env, void* data, size_t bytes,
                    RequestPtr req);
  // Arrival checks: a message of the running op must carry its envelope; one
  // of a passed op is stale; one that matches an entry must agree with it.
  void checkEnvelope(int peer, uint64_t group, const Envelope& env);
  void checkStale(int peer, uint64_t group, const Envelope& env);
  void checkArrival(int peer, const Message& m, const Envelope& env, uint64_t len);
  // Unexpected data: whether `len` more bytes fit the limit
  // (ContextOptions::progress.unexpectedLimitBytes, else GFLOW_UNEXPECTED_LIMIT),
  // and a new staged entry charged against it.
  bool stagingFits(int peer, uint64_t len) const;
  uint64_t unexpectedLimit() const { return unexpectedLimit_; }
  Message* stage(int peer, Tag tag, const Envelope& env, uint64_t len);
  // A new entry for a message announced by the wire whose payload stays with
  // the sender until a receive is posted: kStagedOverhead is charged
  // against the limit (stagingFits(peer, 0) first), nothing is staged.
  Message* announce(int peer, Tag tag, const Envelope& env, uint64_t len);
  // Delivers (copies staging into the user buffer), counts, erases and
  // completes the posted receive `m`.
  void complete(int peer, Message* m);
  bool hasPostedRecv(int peer) const;
  void clearMessages();  // at teardown or after a failure: the entries go

  // Arrival stamps (ContextOptions::arrivals): what a message of `tag`
  // carries; a message header of `group` from `peer` read now; the start of
  // a progress pass, after `readNothing` since the one before.
  // A stamp only for the op this rank runs now: a frame of an op it has
  // left keeps the one it had.
  ArrivalStamp stampOf(Tag tag) const {
    return inArrivalOp(tag.group) ? arrivals_->stamp() : ArrivalStamp{};
  }
  // `now`: the stamp of this moment if already made (words[0] != 0), else
  // made here, so frames leaving together share one.
  void restamp(uint64_t group, uint64_t (&stamp)[3], ArrivalStamp& now) const {
    if (!inArrivalOp(group)) return;
    if (now.words[0] == 0) now = arrivals_->stamp();
    std::memcpy(stamp, now.words, sizeof(stamp));
  }
  void arrival(int peer, uint64_t group, const uint64_t (&stamp)[3]);
  void pass(bool readNothing);

  // Counters.
  void countSendPosted(int peer) {
    books_[peer]->messagesSent.fetch_add(1, std::memory_order_relaxed);
  }
  void countSendDone(int peer, uint64_t bytes) {
    books_[peer]->bytesSent.fetch_add(bytes, std::memory_order_relaxed);
  }
  void countSingleCopy(int peer, uint64_t bytes) {
    books_[peer]->singleCopyBytesSent.fetch_add(bytes, std::memory_order_relaxed);
  }
  void countPong(int peer) { ++books_[peer]->pongs; }
  // A connection to `peer` opened (+1) or closed (-1).
  void countConnection(int peer, int delta) {
    books_[peer]->connections.fetch_add(delta, std::memory_order_relaxed);
  }
  uint64_t pongs(int peer) const { return books_[peer]->pongs; }

 private:
  struct PeerBook {
    std::unordered_map<Tag, std::unique_ptr<Message>, TagHash> msgs;
    uint64_t stagedBytes = 0;
    uint64_t pongs = 0;  // PONGs received (liveness probes answered)
    std::atomic<uint64_t> bytesSent{0}, bytesReceived{0}, messagesSent{0}, messagesReceived{0},
        singleCopyBytesSent{0};
    std::atomic<int32_t> connections{0};
  };

  std::chrono::milliseconds timeout_;
  uint64_t unexpectedLimit_;
  std::shared_ptr<Arrivals> arrivals_;
  std::vector<int> arrivalRanks_;  // peer -> the Arrivals' rank
  struct Early {                   // a stamped header of an op this rank had not begun
    uint64_t group;
    int peer;
    int64_t at;  // Arrivals::now()
    ArrivalStamp stamp;
  };
  std::vector<Early> early_ GFLOW_GUARDED_BY(owner_);
  static constexpr size_t kMaxEarly = 4096;
  uint64_t groupOp_ GFLOW_GUARDED_BY(owner_) = 0;    // the Arrivals' op when group_ began
  uint64_t passGroup_ GFLOW_GUARDED_BY(owner_) = 0;  // group_ when the last pass started
  // This op's backlog is read: arrivals are timed.
  bool settled_ GFLOW_GUARDED_BY(owner_) = false;
  bool passInGroup_ GFLOW_GUARDED_BY(owner_) = false;
  std::vector<std::unique_ptr<PeerBook>> books_;
  // Staged messages' buffers, reused (transport/staging_pool.h).
  static constexpr uint64_t kStagingKeep = uint64_t(64) << 20;
  StagingPool pool_ GFLOW_GUARDED_BY(owner_);
  StickyError error_;  // any thread

  uint64_t group_ GFLOW_GUARDED_BY(owner_) = 0;
  Envelope groupEnv_ GFLOW_GUARDED_BY(owner_){};
  bool groupActive_ GFLOW_GUARDED_BY(owner_) = false;
  // An error report for an op this rank has not reached yet: raised when it
  // gets there, so an op that succeeded everywhere does not fail here.
  std::map<int, Error> reports_ GFLOW_GUARDED_BY(owner_);  // each peer's first failure report
  std::optional<Error> deferredError_ GFLOW_GUARDED_BY(owner_);
  uint64_t deferredGroup_ GFLOW_GUARDED_BY(owner_) = 0;
  // Notices of ops this rank has not started (peerRejected), by op number,
  // and the last op this rank rejected itself.
  std::map<uint64_t, Error> rejected_ GFLOW_GUARDED_BY(owner_);
  std::optional<uint64_t> selfRejected_ GFLOW_GUARDED_BY(owner_);
};

}  // namespace gflow::transport
