// Arrivals: which rank reached each collective last, and by how much (the
// straggler), from what the ranks already exchange (docs/errors.md,
// "Stragglers").
//
// Clocks of different hosts are not compared. Every message of a collective
// carries a stamp (ArrivalStamp): how long its sender had been in the op when
// it posted the message, and what the sender knows so far. A receiver turns
// that into the sender's start on its own clock (arrival - elapsed), so each
// rank estimates, on its own clock, when every rank it hears from (directly
// or through the stamps of others) started. Those estimates only err late
// (by the latency), so each rank's is the earliest it got. The op's verdict:
// the rank that started last, and its start minus the earliest start (the
// skew: how long the earliest rank waited for it).
//
//   - A message read while this rank's transport catches up on what queued
//     before it started (`timed` false: until that transport has made a
//     pass of the op that read nothing) says only that its sender started
//     no later than this rank.
//   - Ranks of one host share a clock: the shared-memory group publishes
//     each member's view (view()) and merges the others' (merge()) exactly.
//   - A rank that started last and heard only from ranks that did not wait
//     for it knows that it was last, not by how much. Every stamp therefore
//     also carries the sender's verdict on its previous op, which replaces
//     this rank's for that op when it is better (better(): measured beats
//     not measured, then the larger skew: it saw a later start). The best
//     verdict a rank hears of spreads with the next op.
//
// Times are TickClock ticks (common/tick_clock.h: the TSC where it is
// invariant), which agree between the processes of a host; only their
// differences become ns (skews, the stamps' offsets).
//
// Thread safety: the running op's methods (begin to end, stamp, observe,
// view, merge, current) come from the executing thread, or, after
// setConcurrent(), from two threads at once (the hierarchical backend runs
// one phase of an op on its phase worker while the executing thread runs the
// other), which a lock then serialises. totals(), recent() and summary()
// may come from any thread. The record is written by one writer at a time:
// the executing thread, or under the op lock (setConcurrent) the thread
// that holds it; so it needs no lock of its own and no atomic
// read-modify-write on an op's path. Its words are atomics, so a reader
// sees each count and verdict whole, though it may see one op's counts
// before its verdict or the other way round.
#pragma once

#include <atomic>
#include <cstdint>
#include <memory>
#include <mutex>
#include <string>
#include <thread>
#include <vector>

#include "common/tick_clock.h"

namespace gflow {

// What every message of a collective carries (3 words; all zero: none).
struct ArrivalStamp {
  uint64_t words[3] = {0, 0, 0};
};

// One op's straggler: the rank that started last (-1: nobody observed) and
// by how many ns after the earliest start. `informed`: the skew was
// measured (a rank that names itself from what queued before it began
// knows only that it was last).
struct ArrivalVerdict {
  int last = -1;
  int64_t skewNs = 0;
  bool informed = false;
};

class Arrivals {
 public:
  // The clock of observe()'s `at` and of View (TickClock ticks).
  static int64_t now() { return TickClock::now(); }

  // `enabled` false: every call is a no-op (GFLOW_STRAGGLER=0).
  Arrivals(int rank, int size, bool enabled);

  bool enabled() const { return enabled_; }
  bool active() const { return active_.load(std::memory_order_acquire); }
  // Ops begun so far (the running one's number while active()).
  uint64_t opNumber() const { return op_.load(std::memory_order_acquire); }

  // A collective starts on this rank now.
  void begin();
  // It succeeded: its verdict is recorded (also when nothing was heard,
  // as no verdict, so that peers' verdicts on it can still fill it in).
  void end();
  // It failed: nothing is recorded.
  void abandon();

  // The running op's verdict as this rank sees it now (last = -1: none, or
  // no op running); executing thread.
  ArrivalVerdict current() const;
  // For a message of the running op (zero outside one).
  ArrivalStamp stamp() const;
  // A message with `s` from `peer` arrived at `at` (now()'s clock);
  // `timed`: read after its transport caught up (above).
  void observe(int peer, int64_t at, const ArrivalStamp& s, bool timed);

  // What this rank knows, in its host's ticks (shared memory).
  struct View {
    int64_t entry = 0;
    int32_t latest = -1;  // -1: none
    int64_t latestAt = 0;
    int64_t firstAt = 0;
  };
  View view() const;
  // `rank`'s view, on this rank's clock.
  void merge(int rank, const View& v);

  // Counts since creation: per rank, how many ops it was last in and the sum
  // of those ops' skews; ops with a verdict.
  struct Totals {
    std::vector<uint64_t> timesLast;
    std::vector<uint64_t> lateNs;
    uint64_t ops = 0;
  };
  Totals totals() const;
  // The verdicts of the last kRecent ops begun (oldest first; last = -1:
  // none, or the op failed).
  static constexpr size_t kRecent = 4096;
  std::vector<ArrivalVerdict> recent() const;
  // "rank 3 was last in 96% of 1200 ops, median skew 14.0 ms" over the ops
  // recorded since the previous call with `sinceLast` (else the whole run);
  // "" when there are none.
  std::string summary(bool sinceLast);
  // Forgets the ops recorded so far (the communicator's own set-up ops).
  void clearRecord();
  // Two threads may run parts of one op (the hierarchical backend's phases
  // overlap): the running op's state is locked from now on. Before the
  // first op.
  void setConcurrent() { concurrent_ = true; }

 private:
  // Held for a few stores and almost never contended: cheaper than a mutex
  // on every op.
  class SpinLock {
   public:
    void lock() {
      while (flag_.test_and_set(std::memory_order_acquire)) std::this_thread::yield();
    }
    void unlock() { flag_.clear(std::memory_order_release); }

   private:
    std::atomic_flag flag_ = ATOMIC_FLAG_INIT;
  };
  // Under opMu_.
  ArrivalVerdict currentLocked() const;
  void note(int rank, int64_t tNs);
  void rescanLatest();
  void amendPrevious(const ArrivalVerdict& theirs);
  // Whether verdict `a` on an op should replace `b` (see the header comment).
  static bool better(const ArrivalVerdict& a, const ArrivalVerdict& b);
  // The record (op's thread only).
  void count(const ArrivalVerdict& v, int sign);
  void put(uint64_t op, const ArrivalVerdict& v);  // op's slot in the ring
  static uint64_t pack(const ArrivalVerdict& v);
  static ArrivalVerdict unpack(uint64_t w);
  Totals readTotals() const;

  const int rank_;
  const int size_;
  const bool enabled_;

  // The running op.
  std::atomic<bool> active_{false};
  std::atomic<uint64_t> op_{0};  // ops begun
  // What follows (the hierarchical backend's two threads; held for a few
  // stores).
  mutable SpinLock opMu_;
  bool concurrent_ = false;  // opMu_ is taken only then
  // Holds opMu_ when concurrent_.
  class OpLock {
   public:
    explicit OpLock(const Arrivals& a) : mu_(a.concurrent_ ? &a.opMu_ : nullptr) {
      if (mu_) mu_->lock();
    }
    ~OpLock() {
      if (mu_) mu_->unlock();
    }
    OpLock(const OpLock&) = delete;
    OpLock& operator=(const OpLock&) = delete;

   private:
    SpinLock* mu_;
  };
  // Ticks: this rank's start, the earliest and the latest start known.
  int64_t entry_ = 0;
  int64_t first_ = 0;
  int latest_ = 0;
  int64_t latestAt_ = 0;
  int64_t hour_ = 0;  // an hour of ticks
  bool heard_ = false;
  bool sameClock_ = false;       // merged a view of this host (exact)
  std::vector<int64_t> est_;     // per rank: earliest start estimate (ticks)
  std::vector<uint64_t> estOp_;  // per rank: the op est_ is for
  std::vector<int> touched_;     // ranks with an estimate this op
  ArrivalVerdict previous_;      // this rank's verdict on the op before
  uint64_t previousOp_ = 0;      // its number (0: none)

  // The record: per rank, times last and the sum of those skews (ns); ops
  // with a verdict; the verdicts (pack()ed) of the last kRecent ops, op n at
  // (n - 1) % kRecent; ops ended or abandoned (the newest number).
  using Word = std::atomic<uint64_t>;
  std::unique_ptr<Word[]> timesLast_, lateNs_;
  Word countedOps_{0};
  std::unique_ptr<Word[]> recent_;
  Word recorded_{0};
  // summary(true)'s mark: recorded_ and the totals then.
  std::mutex summaryMu_;
  uint64_t summarized_ = 0;
  Totals summarizedTotals_;
};

}  // namespace gflow
