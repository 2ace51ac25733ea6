#include "transport/verbs/record_fetch.h"

#include <algorithm>

#include "common/resource_counts.h"

namespace gflow::transport::verbs {

RecordFetcher::RecordFetcher(std::shared_ptr<Store> store, std::function<void()> onArrival)
    : store_(std::move(store)), onArrival_(std::move(onArrival)) {}

RecordFetcher::~RecordFetcher() {
  stop_.store(true, std::memory_order_release);
  for (auto& t : threads_) t.second.join();
}

void RecordFetcher::fetch(int peer, const std::string& key) {
  resources::threadStarted();
  threads_.emplace_back(peer, std::thread([this, peer, key] { run(peer, key); }));
}

std::vector<RecordFetcher::Record> RecordFetcher::take() {
  std::vector<Record> out;
  {
    MutexLock lock(mutex_);
    out.swap(records_);
    arrived_.store(false, std::memory_order_release);
  }
  // A fetch whose record is taken has finished (or is about to): join it
  // now, so that finished threads do not pile up.
  for (const Record& r : out) {
    auto it = std::find_if(threads_.begin(), threads_.end(),
                           [&](const auto& t) { return t.first == r.peer; });
    if (it == threads_.end()) continue;
    it->second.join();
    threads_.erase(it);
  }
  return out;
}

void RecordFetcher::run(int peer, const std::string& key) {
  Record r;
  r.peer = peer;
  while (!stop_.load(std::memory_order_acquire)) {
    try {
      r.value = store_->get(key, kSlice);
      break;
    } catch (const Error& e) {
      if (e.code() == ErrorCode::kTimeout) continue;  // not published yet
      r.error = e;
      break;
    } catch (const std::exception& e) {  // a framework's own store
      r.error = Error(ErrorCode::kInternal, std::string("the store failed: ") + e.what());
      break;
    }
  }
  if (stop_.load(std::memory_order_acquire)) return;
  {
    MutexLock lock(mutex_);
    records_.push_back(std::move(r));
    arrived_.store(true, std::memory_order_release);
  }
  onArrival_();
}

}  // namespace gflow::transport::verbs
