// The executor: runs a communicator's ops one at a time, in the order
// they were issued. A blocking call on an idle executor runs inline on the
// caller's thread (no thread hop on the latency path); otherwise ops queue up
// for the executor's worker thread, started on first need. The worker is gflow's
// progress thread: it pins itself near the rank's NIC (topology/pinning.h;
// Options::progress.pinThreads, else GFLOW_PIN) before running its first op.
// An op may also stay in flight after its task returned (deferCurrent():
// point-to-point messages waiting for their peer); the background function
// (setBackground) drives such ops after every task and, while no task is
// queued, on the worker (spinning briefly, then every millisecond), always
// with the executor to itself like a task. The worker is named
// "gflow-progress" and runs setPriority's levels above its starter.
//
// Beside the worker runs the host lane (core/host_lane.h) for the host
// steps of ops that declare an Overlap: the next op's `ahead` step may run
// there while the op before it executes, and a task may end its op there
// (finishOnLane). Memory order: an op starts only after every lane job
// overlapping its footprint ended (an op without an Overlap: every lane
// job); an op's ahead step runs early only if its footprint is apart from
// the running op's and no point-to-point op is in flight.
#pragma once

#include <atomic>
#include <condition_variable>
#include <deque>
#include <functional>
#include <memory>
#include <mutex>
#include <optional>
#include <string>
#include <thread>
#include <vector>

#include "core/host_lane.h"
#include "gflow/communicator.h"
#include "gflow/error.h"

namespace gflow {

// Shared completion state behind gflow::Work.
class WorkState final : public Work::Completion {
 public:
  void finish(std::shared_ptr<const Error> error);
  bool done() const override;
  // Waits up to `timeout` (0: until done); rethrows the op's error.
  void wait(std::chrono::milliseconds timeout) override;
  // The op's inf/NaN flag (Work::nonFinite), set by the op before it
  // finishes; attached by the submitter before the Work is handed out.
  void setNonFiniteFlag(std::shared_ptr<const std::atomic<bool>> flag) { flag_ = std::move(flag); }
  bool nonFinite() const override {
    return done() && flag_ && flag_->load(std::memory_order_acquire);
  }
  // An op run as consecutive pieces, each an op of its own: this state, the
  // last piece's, is done once `earlier` (the other pieces, in order) are
  // too, and wait() raises the first piece's error, after every piece
  // ended. Attached before the Work is handed out, to the state of an
  // async submit (the executor never waits on those itself).
  void setEarlierPieces(std::vector<std::shared_ptr<WorkState>> earlier) {
    earlier_ = std::move(earlier);
  }

 private:
  // Waits until this piece ended, by `deadline` when `timeout` is set.
  void awaitOwn(std::chrono::milliseconds timeout, std::chrono::steady_clock::time_point deadline);
  bool ownDone() const { return done_.load(std::memory_order_acquire); }

  std::atomic<bool> done_{false};
  std::vector<std::shared_ptr<WorkState>> earlier_;
  mutable std::mutex mutex_;
  std::condition_variable cv_;
  std::shared_ptr<const Error> error_;
  std::shared_ptr<const std::atomic<bool>> flag_;
};

// What an op may run on the host lane: `touches`, all the user memory its
// steps and collective read or write; `ahead` (may be null), its first
// step, which the task runs (OnceStep::run) and the lane may have run
// before it.
struct Overlap {
  Footprint touches;
  std::shared_ptr<OnceStep> ahead;
};

class Executor {
 public:
  using Task = std::function<void()>;
  Executor() = default;
  ~Executor();

  // Queues `task`; returns its completion state. With blocking=true the call
  // returns after the task ran (its error is in the returned state).
  std::shared_ptr<WorkState> submit(Task task, bool blocking,
                                    std::shared_ptr<const Overlap> overlap = nullptr);
  // Runs `task` on this thread when no task is queued or running (as a
  // blocking submit does), else queues it after them without waiting.
  std::shared_ptr<WorkState> runOrQueue(Task task);

  // The running task's op completes later: its state is returned, and the
  // executor does not finish it when the task returns (unless it throws).
  // Executing thread, inside a task.
  std::shared_ptr<WorkState> deferCurrent();
  // Executing thread, inside a task: runs `after`, the op's last step. For
  // an op with an Overlap it runs on the lane once the task returned, and
  // the op completes there (an exception from `after` fails its Work; a
  // task that throws fails the op, and `after` never runs); otherwise here,
  // now.
  void finishOnLane(std::function<void()> after);
  // `fn` drives the deferred ops once without blocking and returns whether
  // any remains in flight; it must not throw. Set before the first op.
  void setBackground(std::function<bool()> fn) { background_ = std::move(fn); }

  // Runs `fn` while no op executes (the caller then owns the transport).
  // Returns false without running it if an op is executing.
  bool tryRunExclusive(const std::function<void()>& fn);

  // Fails queued tasks with `error` and stops the worker. Idempotent.
  void shutdown(const Error& error);

  // The NIC the worker thread pins itself near: an interface ("ens1f0") or
  // an RDMA device ("mlx5_0"); "" for none (the NUMA node of the thread that
  // starts the worker). When never called, the interface the TCP data
  // sockets use for GFLOW_SOCKET_IFNAME. Takes effect when the worker starts
  // (the first queued op); later calls do not move a running worker.
  // `enabled` (Options::progress.pinThreads) false: no pinning; unset: GFLOW_PIN.
  void setPinNear(std::string nic, std::optional<bool> enabled = std::nullopt);
  // Nice levels the worker runs above the thread that starts it
  // (Options::progress.priority / GFLOW_PROGRESS_PRIORITY; 0: the same).
  // Takes effect when the worker starts, like setPinNear.
  void setPriority(int levels);

 private:
  struct Item {
    Item(Task t, std::shared_ptr<const Overlap> o)
        : task(std::move(t)), work(std::make_shared<WorkState>()), overlap(std::move(o)) {}
    Task task;
    std::shared_ptr<WorkState> work;
    std::shared_ptr<const Overlap> overlap;
    bool deferred = false;
    bool ahead = false;             // its ahead step went to the lane
    std::function<void()> laneEnd;  // finishOnLane's, posted after the task
  };
  void run(Item& item);
  // Runs `item` inline when idle and `inlineIfIdle`, else queues it for the
  // worker; *queued says which.
  std::shared_ptr<WorkState> start(Item item, bool inlineIfIdle, bool* queued);
  // Holding mutex_: marks `item` running (current_) / none running.
  void began(const Item& item);
  void ended();
  // Holding mutex_: posts the queue front's ahead step when it may run now.
  void aheadOfFront();
  void runBackground(std::unique_lock<std::mutex>& lock);
  void workerLoop();
  static void pinWorker(bool nicSet, const std::string& nic, std::optional<bool> enabled,
                        int hintCpu) noexcept;
  static void prioritizeWorker(int startNice, int levels) noexcept;

  std::mutex mutex_;
  std::condition_variable cv_;
  std::deque<Item> queue_;
  bool running_ = false;
  bool stop_ = false;
  bool pinNearSet_ = false;
  std::string pinNear_;
  std::optional<bool> pinEnabled_;
  int priority_ = 0;
  std::thread worker_;
  std::function<bool()> background_;
  std::atomic<bool> inFlight_{false};  // background_ has ops to drive
  const Overlap* current_ = nullptr;   // the running op's, when it has one
  HostLane lane_;                      // drained when destroyed, after the worker stopped
};

}  // namespace gflow
