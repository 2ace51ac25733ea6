#include "testing/ranks.h"

#include <gtest/gtest.h>

#include <mutex>
#include <thread>

namespace gflow::testing {

std::vector<std::exception_ptr> onThreads(
    int n, const std::function<void(int, const std::shared_ptr<Store>&)>& body) {
  auto store = createHashStore();
  std::vector<std::exception_ptr> errors(n);
  std::vector<std::thread> threads;
  for (int r = 0; r < n; ++r) {
    threads.emplace_back([&, r] {
      try {
        body(r, store);
      } catch (...) {
        errors[r] = std::current_exception();
      }
    });
  }
  for (auto& t : threads) t.join();
  return errors;
}

namespace {

std::shared_ptr<Communicator> create(Options o, int r, int n, const std::shared_ptr<Store>& store) {
  o.rank = r;
  o.size = n;
  if (!o.store) o.store = store;  // a test's own store, shared with joiners
  return Communicator::create(o);
}

}  // namespace

std::vector<std::exception_ptr> runRanksCollect(int n, const std::function<void(Communicator&)>& fn,
                                                Options base) {
  return onThreads(n, [&](int r, const std::shared_ptr<Store>& store) {
    auto comm = create(base, r, n, store);
    fn(*comm);
  });
}

void runRanks(int n, const std::function<void(Communicator&)>& fn, Options base) {
  auto errors = runRanksCollect(n, fn, base);
  for (int r = 0; r < n; ++r) {
    if (!errors[r]) continue;
    try {
      std::rethrow_exception(errors[r]);
    } catch (const std::exception& e) {
      ADD_FAILURE() << "rank " << r << " threw: " << e.what();
    }
  }
}

std::vector<std::shared_ptr<Communicator>> makeWorld(int n, Options base) {
  std::vector<std::shared_ptr<Communicator>> world(n);
  auto errors = onThreads(
      n, [&](int r, const std::shared_ptr<Store>& store) { world[r] = create(base, r, n, store); });
  for (auto& e : errors) {
    if (e) std::rethrow_exception(e);
  }
  return world;
}

std::vector<std::shared_ptr<Communicator>> makeWorldWith(
    int n, const std::function<Options(int)>& optionsOf) {
  std::vector<std::shared_ptr<Communicator>> world(n);
  auto errors = onThreads(n, [&](int r, const std::shared_ptr<Store>& store) {
    world[r] = create(optionsOf(r), r, n, store);
  });
  for (auto& e : errors) {
    if (e) std::rethrow_exception(e);
  }
  return world;
}

std::function<Options(int)> onHosts(std::vector<int> hostOf, Options base) {
  return [hostOf = std::move(hostOf), base](int r) {
    Options o = base;
    o.hostId = "test-host-" + std::to_string(hostOf.at(r));
    return o;
  };
}

namespace {
std::mutex keptMutex;
std::vector<std::shared_ptr<Communicator>> kept;  // runThreads' communicators
}  // namespace

void keepUntilThreadsEnd(std::shared_ptr<Communicator> c) {
  std::lock_guard<std::mutex> lock(keptMutex);
  kept.push_back(std::move(c));
}

void runThreads(int n, const std::function<void(int)>& body) {
  std::vector<std::thread> threads;
  for (int t = 0; t < n; ++t) {
    threads.emplace_back([&body, t] {
      try {
        body(t);
      } catch (const std::exception& e) {
        ADD_FAILURE() << "thread " << t << " threw: " << e.what();
      }
    });
  }
  for (auto& th : threads) th.join();
  std::lock_guard<std::mutex> lock(keptMutex);
  kept.clear();
}

void forEachRank(const std::vector<std::shared_ptr<Communicator>>& world,
                 const std::function<void(Communicator&)>& fn) {
  std::vector<std::thread> threads;
  std::vector<std::exception_ptr> errors(world.size());
  for (size_t r = 0; r < world.size(); ++r) {
    threads.emplace_back([&, r] {
      try {
        fn(*world[r]);
      } catch (...) {
        errors[r] = std::current_exception();
      }
    });
  }
  for (auto& t : threads) t.join();
  expectNoErrors(errors);
}

bool expectNoErrors(const std::vector<std::exception_ptr>& errs) {
  bool ok = true;
  for (size_t r = 0; r < errs.size(); ++r) {
    if (!errs[r]) continue;
    ok = false;
    try {
      std::rethrow_exception(errs[r]);
    } catch (const std::exception& e) {
      ADD_FAILURE() << "rank " << r << " threw: " << e.what();
    }
  }
  return ok;
}

std::vector<Outcome> runRanksOutcomes(int n, const std::function<void(Communicator&)>& fn,
                                      Options o) {
  if (o.timeout.count() == 0) o.timeout = std::chrono::seconds(20);
  auto errs = runRanksCollect(n, fn, o);
  std::vector<Outcome> out(n);
  for (int r = 0; r < n; ++r) {
    if (!errs[r]) continue;
    try {
      std::rethrow_exception(errs[r]);
    } catch (const Error& e) {
      out[r] = Outcome{true, e.code(), e.what(), e.peer()};
    } catch (const std::exception& e) {
      out[r] = Outcome{true, ErrorCode::kInternal, std::string("non-gflow: ") + e.what(), -1};
    }
  }
  return out;
}

}  // namespace gflow::testing
