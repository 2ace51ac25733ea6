#include "testing/contexts.h"

#include <gtest/gtest.h>

#include "testing/ranks.h"

namespace gflow::testing {

std::vector<std::exception_ptr> runContexts(const std::string& transport, int n,
                                            const std::function<void(transport::Context&)>& body,
                                            std::chrono::milliseconds timeout,
                                            const ProgressOptions& progress) {
  return onThreads(n, [&](int rank, const std::shared_ptr<Store>& store) {
    transport::ContextOptions o;
    o.rank = rank;
    o.size = n;
    o.store = store;
    o.prefix = "t/";
    o.timeout = timeout;
    o.progress = progress;
    // TCP between ranks of one host with single copy on (its threshold is
    // GFLOW_LOCAL_SINGLE_COPY: 4 KiB in the tests).
    const bool single = transport == "tcp_single_copy";
    o.localSingleCopy = single;
    o.hostHash = single ? 1 : 0;
    const bool lazy = transport == "tcp_lazy" || transport == "verbs_lazy";
    if (lazy) o.connect = "lazy";
    const std::string base = single || transport == "tcp_lazy" ? "tcp"
                             : transport == "verbs_lazy"       ? "verbs"
                                                               : transport;
    std::unique_ptr<transport::Context> ctx = transport::createContext(base, o);
    body(*ctx);
  });
}

Error errorOf(const std::exception_ptr& p) {
  if (!p) {
    ADD_FAILURE() << "expected an error, but the rank returned";
    return Error(ErrorCode::kInternal, "no error");
  }
  try {
    std::rethrow_exception(p);
  } catch (const Error& e) {
    return e;
  } catch (const std::exception& e) {
    ADD_FAILURE() << "expected a gflow::Error, got: " << e.what();
  }
  return Error(ErrorCode::kInternal, "not a gflow::Error");
}

void waitOrNotify(transport::Context& c, const transport::RequestPtr& r,
                  std::chrono::milliseconds d) {
  try {
    c.wait(r, Deadline::after(d));
  } catch (const Error&) {
    c.notifyPeers(*c.error());
    throw;
  }
}

std::vector<char> pattern(size_t n, int seed) {
  std::vector<char> v(n);
  for (size_t i = 0; i < n; ++i) v[i] = static_cast<char>((i * 131 + seed * 7 + i / 251) & 0xff);
  return v;
}

}  // namespace gflow::testing
