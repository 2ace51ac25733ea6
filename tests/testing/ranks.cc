#include "testing/ranks.h"

#include <gtest/gtest.h>

#include <thread>

namespace gflow::testing {

std::vector<std::exception_ptr> runRanksCollect(int n, const std::function<void(Communicator&)>& fn,
                                                Options base) {
  auto store = createHashStore();
  std::vector<std::exception_ptr> errors(n);
  std::vector<std::thread> threads;
  for (int r = 0; r < n; ++r) {
    threads.emplace_back([&, r] {
      try {
        Options o = base;
        o.rank = r;
        o.size = n;
        o.store = store;
        auto comm = Communicator::create(o);
        fn(*comm);
      } catch (...) {
        errors[r] = std::current_exception();
      }
    });
  }
  for (auto& t : threads) t.join();
  return errors;
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
  auto store = createHashStore();
  std::vector<std::shared_ptr<Communicator>> world(n);
  std::vector<std::exception_ptr> errors(n);
  std::vector<std::thread> threads;
  for (int r = 0; r < n; ++r) {
    threads.emplace_back([&, r] {
      try {
        Options o = base;
        o.rank = r;
        o.size = n;
        o.store = store;
        world[r] = Communicator::create(o);
      } catch (...) {
        errors[r] = std::current_exception();
      }
    });
  }
  for (auto& t : threads) t.join();
  for (auto& e : errors) {
    if (e) std::rethrow_exception(e);
  }
  return world;
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
  for (size_t r = 0; r < world.size(); ++r) {
    if (!errors[r]) continue;
    try {
      std::rethrow_exception(errors[r]);
    } catch (const std::exception& e) {
      ADD_FAILURE() << "rank " << r << " threw: " << e.what();
    }
  }
}

}  // namespace gflow::testing
