// Waits for records in the bootstrap store on background threads, for the
// verbs transport's connections on demand (verbs_connect.cc), so that the
// op thread never waits on a peer that has not reached the op:
//   - fetch(): one peer's connection record, one thread until it arrives;
//   - follow(): the keys PREFIX1, PREFIX2, ... in turn, for the life of the
//     fetcher: the requests of peers that want to connect to this rank.
// Each thread waits on the store in slices of kSlice. Destroying the fetcher
// does not wait for them: it stops delivery at once, and each thread ends
// after its current slice, holding the store (a shared_ptr) until then.
//
// Thread safety: fetch(), follow() and take() on the owning thread;
// hasArrived() anywhere; `onArrival` runs on a fetch's thread, never after
// the destructor has returned.
#pragma once

#include <atomic>
#include <chrono>
#include <functional>
#include <memory>
#include <optional>
#include <string>
#include <thread>
#include <vector>

#include "common/thread_annotations.h"
#include "gflow/error.h"
#include "gflow/store.h"

namespace gflow::transport::verbs {

class RecordFetcher {
 public:
  static constexpr std::chrono::milliseconds kSlice{30000};

  struct Record {
    int peer = -1;  // fetch(): whose record; follow(): -1
    std::vector<uint8_t> value;
    std::optional<Error> error;  // the store failed (not: the record is late)
  };

  RecordFetcher(std::shared_ptr<Store> store, std::function<void()> onArrival);
  ~RecordFetcher();
  RecordFetcher(const RecordFetcher&) = delete;
  RecordFetcher& operator=(const RecordFetcher&) = delete;

  void fetch(int peer, const std::string& key);
  void follow(const std::string& prefix);
  // The records that have arrived since the last call.
  std::vector<Record> take();
  bool hasArrived() const { return shared_->arrived.load(std::memory_order_acquire); }

 private:
  struct Shared {
    std::shared_ptr<Store> store;
    Mutex mutex;
    bool stopped GFLOW_GUARDED_BY(mutex) = false;
    std::vector<Record> records GFLOW_GUARDED_BY(mutex);
    std::function<void()> onArrival GFLOW_GUARDED_BY(mutex);
    std::atomic<bool> arrived{false};
  };
  // Waits for `key`; false when the fetcher was destroyed meanwhile.
  static bool await(Shared& s, const std::string& key, Record& r);
  // Delivers `r`; false when the fetcher was destroyed.
  static bool deliver(Shared& s, Record r);
  void start(int peer, std::function<void()> body);

  const std::shared_ptr<Shared> shared_;
  std::vector<std::pair<int, std::thread>> threads_;  // (peer or -1, thread); owning thread
};

}  // namespace gflow::transport::verbs
