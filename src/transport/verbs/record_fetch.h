// Fetches peers' connection records from the bootstrap store on background
// threads, for the verbs transport's connections on demand
// (verbs_connect.cc): a rank that needs a peer publishes its end and waits
// for the peer's without blocking its op thread, which may be running the
// very op the peer needs to reach before it publishes.
//
// One thread per fetch, ending when the record arrives (or the fetch fails,
// or the fetcher is destroyed); a fetch waits on the store in slices of
// kSlice so that destruction is never held up for longer.
//
// Thread safety: fetch() and take() on the owning thread; hasArrived()
// anywhere; `onArrival` runs on a fetch's thread.
#pragma once

#include <atomic>
#include <chrono>
#include <functional>
#include <memory>
#include <optional>
#include <string>
#include <thread>
#include <utility>
#include <vector>

#include "common/thread_annotations.h"
#include "gflow/error.h"
#include "gflow/store.h"

namespace gflow::transport::verbs {

class RecordFetcher {
 public:
  static constexpr std::chrono::milliseconds kSlice{1000};

  struct Record {
    int peer = -1;
    std::vector<uint8_t> value;
    std::optional<Error> error;  // the store failed (not: the record is late)
  };

  RecordFetcher(std::shared_ptr<Store> store, std::function<void()> onArrival);
  ~RecordFetcher();
  RecordFetcher(const RecordFetcher&) = delete;
  RecordFetcher& operator=(const RecordFetcher&) = delete;

  // Starts waiting for `key`, the record of `peer`.
  void fetch(int peer, const std::string& key);
  // The records that have arrived since the last call.
  std::vector<Record> take();
  bool hasArrived() const { return arrived_.load(std::memory_order_acquire); }

 private:
  void run(int peer, const std::string& key);

  const std::shared_ptr<Store> store_;
  const std::function<void()> onArrival_;
  std::atomic<bool> stop_{false};
  std::atomic<bool> arrived_{false};
  Mutex mutex_;
  std::vector<Record> records_ GFLOW_GUARDED_BY(mutex_);
  std::vector<std::pair<int, std::thread>> threads_;  // (peer, its fetch); owning thread
};

}  // namespace gflow::transport::verbs
