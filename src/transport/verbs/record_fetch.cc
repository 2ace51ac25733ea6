#include "transport/verbs/record_fetch.h"

#include <algorithm>
#include <utility>

#include "common/resource_counts.h"

namespace gflow::transport::verbs {

RecordFetcher::RecordFetcher(std::shared_ptr<Store> store, std::function<void()> onArrival)
    : shared_(std::make_shared<Shared>()) {
  shared_->store = std::move(store);
  MutexLock lock(shared_->mutex);
  shared_->onArrival = std::move(onArrival);
}

RecordFetcher::~RecordFetcher() {
  {
    MutexLock lock(shared_->mutex);  // waits for a callback under way
    shared_->stopped = true;
    shared_->onArrival = nullptr;
  }
  for (auto& t : threads_) t.second.detach();  // each ends after its slice
}

void RecordFetcher::start(int peer, std::function<void()> body) {
  std::thread t(std::move(body));
  resources::threadStarted();
  threads_.emplace_back(peer, std::move(t));
}

void RecordFetcher::fetch(int peer, const std::string& key) {
  start(peer, [s = shared_, peer, key] {
    Record r;
    r.peer = peer;
    if (await(*s, key, r)) deliver(*s, std::move(r));
  });
}

void RecordFetcher::follow(const std::string& prefix) {
  start(-1, [s = shared_, prefix] {
    for (uint64_t k = 1;; ++k) {
      Record r;
      if (!await(*s, prefix + std::to_string(k), r)) return;
      const bool failed = r.error.has_value();
      if (!deliver(*s, std::move(r)) || failed) return;
    }
  });
}

bool RecordFetcher::await(Shared& s, const std::string& key, Record& r) {
  for (;;) {
    {
      MutexLock lock(s.mutex);
      if (s.stopped) return false;
    }
    try {
      r.value = s.store->get(key, kSlice);
      return true;
    } catch (const Error& e) {
      if (e.code() == ErrorCode::kTimeout) continue;  // not published yet
      r.error = e;
      return true;
    } catch (const std::exception& e) {  // a framework's own store
      r.error = Error(ErrorCode::kInternal, std::string("the store failed: ") + e.what());
      return true;
    }
  }
}

bool RecordFetcher::deliver(Shared& s, Record r) {
  MutexLock lock(s.mutex);
  if (s.stopped) return false;
  s.records.push_back(std::move(r));
  s.arrived.store(true, std::memory_order_release);
  if (s.onArrival) s.onArrival();
  return true;
}

std::vector<RecordFetcher::Record> RecordFetcher::take() {
  std::vector<Record> out;
  {
    MutexLock lock(shared_->mutex);
    out.swap(shared_->records);
    shared_->arrived.store(false, std::memory_order_release);
  }
  // A fetch whose record is taken has finished (or is about to): join it
  // now, so that finished threads do not pile up.
  for (const Record& r : out) {
    if (r.peer < 0) continue;
    auto it = std::find_if(threads_.begin(), threads_.end(),
                           [&](const auto& t) { return t.first == r.peer; });
    if (it == threads_.end()) continue;
    it->second.join();
    threads_.erase(it);
  }
  return out;
}

}  // namespace gflow::transport::verbs
