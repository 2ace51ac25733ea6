#include "core/executor.h"

#include "common/check.h"
#include "common/logging.h"
#include "common/resource_counts.h"
#include "common/thread_priority.h"
#include "topology/data_interface.h"
#include "topology/pinning.h"

#include <pthread.h>

namespace gflow {

void WorkState::finish(std::shared_ptr<const Error> error) {
  {
    std::lock_guard<std::mutex> lock(mutex_);
    // The first outcome stands (a deferred op whose task threw afterwards
    // is finished by the executor and again by whoever drives it).
    if (ownDone()) return;
    error_ = std::move(error);
    done_.store(true, std::memory_order_release);
  }
  cv_.notify_all();
}

bool WorkState::done() const {
  for (const auto& piece : earlier_) {
    if (!piece->done()) return false;
  }
  return ownDone();
}

void WorkState::awaitOwn(std::chrono::milliseconds timeout,
                         std::chrono::steady_clock::time_point deadline) {
  std::unique_lock<std::mutex> lock(mutex_);
  if (timeout.count() <= 0) {
    cv_.wait(lock, [&] { return ownDone(); });
  } else if (!cv_.wait_until(lock, deadline, [&] { return ownDone(); })) {
    GFLOW_THROW(kTimeout, ErrorContext{"wait"})
        << "Work::wait gave up after " << timeout.count()
        << " ms; the op is still running and may complete later";
  }
}

void WorkState::wait(std::chrono::milliseconds timeout) {
  const auto deadline = std::chrono::steady_clock::now() + timeout;
  for (const auto& piece : earlier_) piece->awaitOwn(timeout, deadline);
  awaitOwn(timeout, deadline);
  for (const auto& piece : earlier_) {
    if (piece->error_) throw *piece->error_;
  }
  if (error_) throw *error_;
}

Work::Completion::~Completion() = default;

bool Work::test() const {
  if (!state_) return true;
  return state_->done();
}

bool Work::nonFinite() const {
  return state_ && state_->nonFinite();
}

void Work::wait(std::chrono::milliseconds timeout) const {
  if (!state_) return;
  state_->wait(timeout);
}

Executor::~Executor() {
  shutdown(Error(ErrorCode::kAborted, "communicator destroyed"));
}

namespace {
thread_local void* tlsCurrent = nullptr;  // the Item a task of this thread runs for

// Runs `fn`; its error (null: none), any exception made a gflow::Error.
std::shared_ptr<const Error> outcome(const std::function<void()>& fn) {
  try {
    fn();
  } catch (const Error& e) {
    return std::make_shared<const Error>(e);
  } catch (const std::exception& e) {
    return std::make_shared<const Error>(
        Error(ErrorCode::kInternal, std::string("unexpected exception: ") + e.what()));
  }
  return nullptr;
}
}  // namespace

std::shared_ptr<WorkState> Executor::deferCurrent() {
  auto* item = static_cast<Item*>(tlsCurrent);
  GFLOW_ENFORCE(item != nullptr);
  item->deferred = true;
  return item->work;
}

void Executor::finishOnLane(std::function<void()> after) {
  auto* item = static_cast<Item*>(tlsCurrent);
  if (!item || !item->overlap) {
    after();
    return;
  }
  item->laneEnd = std::move(after);  // posted once the task returned
}

void Executor::run(Item& item) {
  // Memory order: the lane's jobs of earlier ops on this op's memory end first.
  if (item.overlap) {
    lane_.waitFor(item.overlap->touches);
  } else {
    lane_.drain();
  }
  tlsCurrent = &item;
  std::shared_ptr<const Error> error = outcome(item.task);
  tlsCurrent = nullptr;
  // A step that ran ahead has ended before the op does (so a failed op
  // leaves nothing touching its memory).
  if (item.overlap && item.overlap->ahead) item.overlap->ahead->settle();
  if (item.laneEnd && !error) {
    lane_.post(item.overlap->touches,
               [work = item.work, end = std::move(item.laneEnd)] { work->finish(outcome(end)); });
  } else if (error || !item.deferred) {
    item.work->finish(std::move(error));
  }
  if (background_) inFlight_ = background_();
}

// Worker, holding `lock`, with an empty queue and ops in flight: drives
// them once with the executor to itself.
void Executor::runBackground(std::unique_lock<std::mutex>& lock) {
  running_ = true;
  lock.unlock();
  inFlight_ = background_();
  lock.lock();
  running_ = false;
  cv_.notify_all();
}

std::shared_ptr<WorkState> Executor::submit(Task task, bool blocking,
                                            std::shared_ptr<const Overlap> overlap) {
  bool queued = false;
  auto work = start(Item(std::move(task), std::move(overlap)), blocking, &queued);
  if (blocking && queued) {
    try {
      work->wait(std::chrono::milliseconds(0));
    } catch (const Error&) {
      // The caller reads the error from the returned state.
    }
  }
  return work;
}

std::shared_ptr<WorkState> Executor::runOrQueue(Task task) {
  bool queued = false;
  return start(Item(std::move(task), nullptr), true, &queued);
}

void Executor::began(const Item& item) {
  running_ = true;
  current_ = item.overlap.get();
}

void Executor::ended() {
  running_ = false;
  current_ = nullptr;
}

void Executor::aheadOfFront() {
  if (queue_.empty() || !current_ || inFlight_) return;
  Item& next = queue_.front();
  if (next.ahead || !next.overlap || !next.overlap->ahead) return;
  // The lane runs its jobs in order, so an earlier op's end posted there
  // runs first; only the running op's collective (and the end it will post)
  // could meet this step.
  if (overlaps(next.overlap->touches, current_->touches)) return;
  next.ahead = true;
  lane_.post(next.overlap->touches, [step = next.overlap->ahead] { step->runQuietly(); });
}

std::shared_ptr<WorkState> Executor::start(Item item, bool inlineIfIdle, bool* queued) {
  std::unique_lock<std::mutex> lock(mutex_);
  if (stop_) {
    item.work->finish(std::make_shared<const Error>(
        Error(ErrorCode::kAborted, "the communicator is shutting down")));
    return item.work;
  }
  if (inlineIfIdle && queue_.empty() && !running_) {
    began(item);
    lock.unlock();
    run(item);
    lock.lock();
    ended();
    // The worker may wait for this op to end: queued ops, or ops in flight.
    if (!queue_.empty() || inFlight_) cv_.notify_all();
    return item.work;
  }
  auto work = item.work;
  queue_.push_back(std::move(item));
  aheadOfFront();
  if (!worker_.joinable()) {
    // The starting thread's cpu: the NUMA node to stay on when no NIC is known.
    const int hintCpu = topology::currentCpu();
    const int startNice = thread_priority::currentNice();
    resources::threadStarted();
    // The lane's thread (started on its first job) placed like the worker.
    auto setup = [nicSet = pinNearSet_, nic = pinNear_, on = pinEnabled_, hintCpu, startNice,
                  levels = priority_] {
      pinWorker(nicSet, nic, on, hintCpu);
      prioritizeWorker(startNice, levels);
    };
    lane_.setThreadSetup(setup);
    worker_ = std::thread([this, setup] {
      pthread_setname_np(pthread_self(), "gflow-progress");
      setup();
      workerLoop();
    });
  }
  cv_.notify_all();
  *queued = true;
  return work;
}

bool Executor::tryRunExclusive(const std::function<void()>& fn) {
  std::unique_lock<std::mutex> lock(mutex_);
  if (running_) return false;
  running_ = true;
  lock.unlock();
  try {
    fn();
  } catch (...) {
  }
  lock.lock();
  running_ = false;
  cv_.notify_all();
  return true;
}

void Executor::setPinNear(std::string nic, std::optional<bool> enabled) {
  std::lock_guard<std::mutex> lock(mutex_);
  pinNear_ = std::move(nic);
  pinNearSet_ = true;
  pinEnabled_ = enabled;
}

// Runs on the worker before its first op. Pinning is an optimisation: it
// never fails an op (pinCurrentThreadNear logs and ignores its failures).
void Executor::pinWorker(bool nicSet, const std::string& nic, std::optional<bool> enabled,
                         int hintCpu) noexcept {
  try {
    topology::pinCurrentThreadNear(nicSet ? nic : topology::dataInterfaceName(), hintCpu, enabled);
  } catch (...) {
  }
}

void Executor::setPriority(int levels) {
  std::lock_guard<std::mutex> lock(mutex_);
  priority_ = levels;
}

// Runs on the worker before its first op; like pinning, never fails an op.
void Executor::prioritizeWorker(int startNice, int levels) noexcept {
  if (levels == 0) return;
  try {
    const int nice = thread_priority::niceAbove(startNice, levels);
    const std::string err = thread_priority::setCurrentNice(nice);
    if (err.empty()) {
      GFLOW_LOG(INFO) << "progress thread at nice " << nice << " (" << levels
                      << " levels above its starter's " << startNice << ")";
    } else {
      // Once per process: every communicator (and split) would repeat it.
      static std::atomic<bool> warned{false};
      const auto level = warned.exchange(true) ? log::Level::DEBUG : log::Level::WARN;
      if (!log::enabled(level)) return;
      log::Line(level, __FILE__, __LINE__).stream()
          << "progress thread stays at nice " << thread_priority::currentNice()
          << ": GFLOW_PROGRESS_PRIORITY / Options::progress.priority " << levels
          << " asks for nice " << nice << ", which failed: " << err;
    }
  } catch (...) {
  }
}

void Executor::workerLoop() {
  std::unique_lock<std::mutex> lock(mutex_);
  int idle = 0;  // background rounds since the last task
  for (;;) {
    cv_.wait(lock, [&] { return stop_ || ((!queue_.empty() || inFlight_) && !running_); });
    if (queue_.empty() && stop_) return;
    if (running_) continue;
    if (queue_.empty()) {
      runBackground(lock);
      // Spin briefly, then poll every millisecond (or at the next task).
      if (inFlight_ && ++idle > 64) {
        cv_.wait_for(lock, std::chrono::milliseconds(1), [&] { return stop_ || !queue_.empty(); });
      }
      continue;
    }
    idle = 0;
    Item item = std::move(queue_.front());
    queue_.pop_front();
    began(item);
    aheadOfFront();
    lock.unlock();
    run(item);
    lock.lock();
    ended();
    cv_.notify_all();
  }
}

void Executor::shutdown(const Error& error) {
  std::deque<Item> dropped;
  {
    std::lock_guard<std::mutex> lock(mutex_);
    stop_ = true;
    dropped.swap(queue_);
  }
  cv_.notify_all();
  for (auto& item : dropped) {
    if (item.overlap && item.overlap->ahead) item.overlap->ahead->settle();
    item.work->finish(std::make_shared<const Error>(error));
  }
  if (worker_.joinable() && worker_.get_id() != std::this_thread::get_id()) worker_.join();
}

}  // namespace gflow
