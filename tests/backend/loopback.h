// Backends over loopback contexts, for the direct backend tests: every
// rank's backend lives in this process, built over TCP contexts on
// 127.0.0.1 that share one in-memory store, and each op runs on one thread
// per rank (the thread that calls the backend drives its transport).
//
// A BackendWorld is used from the test's main thread; run() hands each rank's
// backend to its own thread and joins them all before it returns, so a
// backend is never called from two threads at once.
#pragma once

#include <gtest/gtest.h>

#include <chrono>
#include <exception>
#include <functional>
#include <memory>
#include <string>
#include <thread>
#include <vector>

#include "backend/backend.h"
#include "gflow/error.h"
#include "gflow/store.h"
#include "testing/contexts.h"
#include "testing/ranks.h"
#include "transport/transport.h"

namespace gflow::testing {

// Options of a TCP context over 127.0.0.1 for `rank` of `size`, whose store
// keys live under `prefix`.
inline transport::ContextOptions loopbackOptions(int rank, int size,
                                                 const std::shared_ptr<Store>& store,
                                                 const std::string& prefix,
                                                 std::chrono::milliseconds timeout) {
  transport::ContextOptions o;
  o.rank = rank;
  o.size = size;
  o.store = store;
  o.prefix = prefix;
  o.timeout = timeout;
  o.tcp.socketIfname = "=lo";
  return o;
}

// A host backend over a connected loopback TCP context. Collective over the
// `size` ranks that call it with the same store and prefix.
inline std::unique_ptr<backend::Backend> loopbackHostBackend(int rank, int size,
                                                             const std::shared_ptr<Store>& store,
                                                             const std::string& prefix,
                                                             std::chrono::milliseconds timeout) {
  return backend::createHostBackend(
      transport::createContext("tcp", loopbackOptions(rank, size, store, prefix, timeout)));
}

// Runs fn(rank) on n threads at once, joins them, and returns what each threw
// (nullptr where fn returned).
inline std::vector<std::exception_ptr> onRankThreads(int n, const std::function<void(int)>& fn) {
  std::vector<std::exception_ptr> errors(n);
  std::vector<std::thread> threads;
  for (int r = 0; r < n; ++r) {
    threads.emplace_back([&, r] {
      try {
        fn(r);
      } catch (...) {
        errors[r] = std::current_exception();
      }
    });
  }
  for (auto& t : threads) t.join();
  return errors;
}

class BackendWorld {
 public:
  using Build = std::function<std::unique_ptr<backend::Backend>(
      int rank, const std::shared_ptr<Store>& store)>;
  using Body = std::function<void(int rank, backend::Backend& b)>;

  // Builds every rank's backend with build(rank, store), on n threads at
  // once (building is collective), over one shared in-memory store. Throws
  // the first rank's error.
  BackendWorld(int n, const Build& build) : backends_(n) {
    auto store = createHashStore();
    auto errors = onRankThreads(n, [&](int r) { backends_[r] = build(r, store); });
    for (auto& e : errors) {
      if (e) std::rethrow_exception(e);
    }
  }

  // n host backends over one loopback TCP context.
  static BackendWorld host(int n,
                           std::chrono::milliseconds timeout = std::chrono::milliseconds(20000)) {
    return BackendWorld(n, [&](int r, const std::shared_ptr<Store>& store) {
      return loopbackHostBackend(r, n, store, "world/", timeout);
    });
  }

  int size() const { return static_cast<int>(backends_.size()); }
  backend::Backend& at(int rank) { return *backends_[rank]; }

  // The next op of this world (every rank runs it with the same sequence
  // number); its deadline starts now.
  backend::Op op(const backend::OpDesc& desc,
                 std::chrono::milliseconds deadline = std::chrono::milliseconds(20000)) {
    backend::Op o;
    o.seq = ++seq_;
    o.desc = desc;
    o.deadline = Deadline::after(deadline);
    return o;
  }

  // Runs body(rank, backend) for every rank on its own thread and joins.
  // With `abortOthers`, a rank that throws aborts the other ranks' backends
  // with its error so that they stop waiting for it (tests of failures pass
  // false to see what each rank raises by itself). Returns what each rank
  // threw.
  std::vector<std::exception_ptr> runCollect(const Body& body, bool abortOthers = true) {
    return onRankThreads(size(), [&](int r) {
      try {
        body(r, *backends_[r]);
      } catch (const Error& e) {
        for (int p = 0; abortOthers && p < size(); ++p) {
          if (p != r) backends_[p]->abort(e);
        }
        throw;
      }
    });
  }

  // runCollect, failing the test with every rank's exception; true when no
  // rank threw.
  bool run(const Body& body) { return expectNoErrors(runCollect(body)); }

 private:
  std::vector<std::unique_ptr<backend::Backend>> backends_;
  uint64_t seq_ = 0;
};

}  // namespace gflow::testing
