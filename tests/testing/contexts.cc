#include "testing/contexts.h"

#include <gtest/gtest.h>

#include "testing/ranks.h"

namespace gflow::testing {

std::vector<std::exception_ptr> runContexts(const std::string& transport, int n,
                                            const std::function<void(transport::Context&)>& body,
                                            std::chrono::milliseconds timeout) {
  return onThreads(n, [&](int rank, const std::shared_ptr<Store>& store) {
    transport::ContextOptions o;
    o.rank = rank;
    o.size = n;
    o.store = store;
    o.prefix = "t/";
    o.timeout = timeout;
    std::unique_ptr<transport::Context> ctx = transport::createContext(transport, o);
    body(*ctx);
  });
}

Error errorOf(const std::exception_ptr& p) {
  try {
    std::rethrow_exception(p);
  } catch (const Error& e) {
    return e;
  }
}

void expectNoErrors(const std::vector<std::exception_ptr>& errs) {
  for (size_t r = 0; r < errs.size(); ++r) {
    if (!errs[r]) continue;
    try {
      std::rethrow_exception(errs[r]);
    } catch (const std::exception& e) {
      ADD_FAILURE() << "rank " << r << ": " << e.what();
    }
  }
}

}  // namespace gflow::testing
