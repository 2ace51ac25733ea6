// shm::Group: the ranks of one host joined by shared memory.
//
// Every member owns one segment: a control block and two data slots. A
// collective is a sequence of chunk iterations; iteration i uses slot i % 2
// of every member. Members move in lock step through numbered sync points:
// sync() publishes "I reached sync point t" (a counter in the control block)
// and waits until every member has. The rules that make two slots enough:
//   - a member writes its slot for iteration i only after the last sync of
//     iteration i-1;
//   - reads of other members' slots for iteration i end before the reader's
//     first sync of iteration i+1.
// So when a member writes slot i % 2 again (iteration i+2), every reader of
// iteration i has passed a later sync point.
//
// Each op publishes its sequence number and envelope before its first sync;
// the first sync of an op compares them with every member's, so ranks that
// call different collectives fail with kMismatch instead of mixing data.
// A member that rejects an op (reject: its arguments were invalid) publishes
// its number instead of running it; a member waiting in that op fails with
// kMismatch at once, and members that rejected it too never look.
//
// Each op's record also carries the member's arrival view (when it began,
// and what it knew of the others: common/arrivals.h), which the others
// merge when the op ends.
//
// Single-copy reads: where every member may read every other member's
// memory (common/peer_memory.h), an op can publish its user buffers
// (publishBuffers) and members read each other's straight from them
// (readPeer) instead of through the slots. Whether the group can is agreed
// at connect, so every member takes the same path.
//
// Waiting spins (yielding the core when the host has fewer cores than
// members), then sleeps on a futex in short slices; between slices it checks
// the op's deadline, abort(), failures published by members and whether a
// member's process has exited (kPeerLost). When the deadline passes, the
// waiter probes the member it waits on under the network transports' blame
// policy (transport/liveness.h): a counter in the member's memory that the
// member raises to answer (answerProbes) from its own waits, and from the
// waits of the other transport of a composed op (setWhileWaiting, wired by
// the hierarchical backend). A member that answers is waiting itself, so the
// waiter gives it the time to report the rank that stalled.
#pragma once

#include <atomic>
#include <chrono>
#include <cstdint>
#include <functional>
#include <memory>
#include <string>
#include <vector>

#include "common/arrivals.h"
#include "common/deadline.h"
#include "common/shared_segment.h"
#include "common/sticky_error.h"
#include "gflow/error.h"
#include "gflow/store.h"
#include "transport/liveness.h"
#include "transport/transport.h"

namespace gflow::backend::shm {

using transport::Envelope;
using transport::EnvelopeFormatter;

struct GroupOptions {
  int rank = 0;                // among the members
  int size = 1;                // members
  std::vector<int> commRanks;  // member -> rank named in errors (empty: identity)
  std::shared_ptr<Store> store;
  std::string prefix;  // store keys of this group live under it
  std::chrono::milliseconds timeout{300000};
  size_t slotBytes = 0;         // 0: GFLOW_SHM_CHUNK
  EnvelopeFormatter describe;   // names ops in mismatch errors
  bool probeSingleCopy = true;  // false: skip the probe, singleCopy() is false
  // Who reached each op last (common/arrivals.h): each member publishes its
  // view at beginOp and merges the others' at endOp (one host: one clock).
  // `arrivalRanks`: member -> the Arrivals' rank (empty: commRanks).
  std::shared_ptr<Arrivals> arrivals;
  std::vector<int> arrivalRanks;
};

struct Control;
struct OpRecord;

class Group {
 public:
  // Collective over the members. Returns nullptr, with the reason in *why, on
  // every member if any member cannot map every segment (e.g. /proc/<pid>/fd
  // not accessible across containers), so all members fall back together.
  static std::unique_ptr<Group> connect(const GroupOptions& options, std::string* why);
  ~Group();

  int rank() const { return rank_; }
  int size() const { return size_; }
  size_t slotBytes() const { return slotBytes_; }

  // Starts an op (`seq` names it in errors) with `env`; the deadline bounds
  // its waits. Every member must start the same ops in the same order.
  void beginOp(uint64_t seq, const Envelope& env, Deadline deadline);
  // The slot of `member` for the current iteration.
  char* slot(int member) const { return slots_[member] + (iter_ & 1) * slotBytes_; }
  // More members than cores this process may run on.
  bool oversubscribed() const { return oversubscribed_; }
  // True when every member can read every other member's published buffers.
  bool singleCopy() const { return singleCopy_; }
  // Publishes this member's buffers for the current op, with whether they
  // can be read by single copy at all (peer_memory.h, ownBuffersReadable);
  // call after beginOp and before its first sync. Peers read them until the
  // op's last sync.
  void publishBuffers(const void* in, size_t inBytes, const void* out, size_t outBytes);
  // After the op's first sync: every member's published buffers can be read
  // (the same answer on every member).
  bool publishedReadable() const;
  enum class Buffer { kIn, kOut };
  // Copies `bytes` at byte `offset` of `member`'s published buffer into
  // `dst`. Only between syncs at which the member's data is final and it
  // cannot return from the op. Raises kPeerLost if the member is gone,
  // kInternal if its buffer cannot be read.
  void readPeer(int member, Buffer which, size_t offset, void* dst, size_t bytes);
  // Moves to the next chunk iteration (the next slot).
  void nextIteration() { ++iter_; }
  // Publishes this member's next sync point and waits for every member.
  void sync();
  // Marks the end of the current op (failures reported after it concern the
  // next one).
  void endOp();

  // Any thread: records `error` unless one is held (the first wins). A wait
  // of the running op raises it (noticed within one futex sleep slice), and
  // so does every later beginOp.
  void abort(const Error& error) { error_.set(error); }
  void notifyPeers(const Error& error);
  // After a failure: the failure report of every member that failed, once
  // each member but `exclude` has failed or is gone, or at `until`.
  std::vector<Error> awaitReports(Deadline until, int exclude);
  // This member will not run op `seq` (`why`: the call's arguments were
  // rejected). Owning thread, between ops.
  void reject(uint64_t seq, const std::string& why);
  // Answers the probes raised on this member's memory; true if one was
  // waiting for an answer. Any thread.
  bool answerProbes();
  // `hook` runs while this member's waits sleep, every few ms (owning
  // thread; set before the first op).
  void setWhileWaiting(std::function<void()> hook) { whileWaiting_ = std::move(hook); }
  std::shared_ptr<const Error> error() const { return error_.get(); }
  // Records that this member read `bytes` of `member`'s slots (algorithms
  // call it; it feeds peerStats on both sides).
  void countRead(int member, uint64_t bytes);
  // bytesReceived: read from `member`'s slots; bytesSent: what `member` read
  // from ours. Message counts stay 0 (there are no messages).
  PeerStats peerStats(int member) const;

 private:
  Group() = default;
  void waitFor(int member, uint64_t tick);
  [[noreturn]] void raise(const Error& e);
  // Raises if waiting for `member` to reach `tick` cannot succeed (abort,
  // a failure reported by any member, the member exited, the deadline as
  // `probe` rules); probes the member once the deadline has passed.
  void checkSlow(int member, uint64_t tick, transport::LivenessProbe& probe);
  Error timeoutError(int member, bool alive) const;
  // The seq of the newest op `member` started; the error for a member that
  // rejected (or skipped) this member's current op.
  uint64_t latestSeq(int member) const;
  Error rejection(int member) const;
  Error reportOf(int member) const;  // `member`'s failure report (its control block)
  // Whether `member`, which this member waits on to reach `tick`, will never
  // run this op: it rejected it, started a later op, or rejected a later
  // one without starting this.
  bool skippedThisOp(int member, uint64_t tick) const;

  void checkOp(int member);
  void publishArrival(OpRecord& r) const;
  void mergeArrivals();
  void publish(uint64_t tick);
  ErrorContext context(int member) const;

  int rank_ = 0;
  int size_ = 1;
  size_t slotBytes_ = 0;
  std::chrono::milliseconds timeout_{300000};  // sizes the probe's grace
  std::function<void()> whileWaiting_;
  std::vector<int> commRanks_;
  Mapping own_;
  std::vector<Mapping> peers_;
  std::vector<Control*> ctl_;
  std::vector<char*> slots_;
  std::vector<ProcessWatch> watch_;
  std::vector<pid_t> pids_;
  bool singleCopy_ = false;
  bool warnedUnreadable_ = false;
  std::vector<std::atomic<uint64_t>*> readFrom_;  // per member: our counters of reads from it
  bool oversubscribed_ = false;
  EnvelopeFormatter describe_;
  std::shared_ptr<Arrivals> arrivals_;  // null: none
  std::vector<int> arrivalRanks_;

  uint64_t tick_ = 0;
  uint64_t iter_ = 0;
  uint64_t seq_ = 0;
  uint64_t ops_ = 0;  // ops started on this group
  Envelope env_;
  bool opChecked_ = true;
  bool inOp_ = false;
  Deadline deadline_ = Deadline::never();

  // The first failure of this member: abort() or a raised error. Waiters
  // poll it (no wake callback: they sleep in short futex slices).
  StickyError error_;
};

}  // namespace gflow::backend::shm
