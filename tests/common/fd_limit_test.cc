// The open-file limit (common/fd_limit.h): the soft limit is raised to the
// hard one, and a context that would run out of descriptors fails before
// it opens any, saying how many it needs and which limit to raise. Each
// case runs in a forked child, whose limits are its own.
#include "common/fd_limit.h"

#include <gmock/gmock.h>
#include <gtest/gtest.h>
#include <sys/resource.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cstring>
#include <functional>
#include <string>

#include "gflow/store.h"
#include "transport/transport.h"

namespace gflow {
namespace {

using ::testing::HasSubstr;

// Runs `body` in a child with RLIMIT_NOFILE soft/hard; returns what it
// wrote to its pipe (its result, as text).
std::string inChild(rlim_t soft, rlim_t hard, const std::function<std::string()>& body) {
  int fds[2];
  if (::pipe(fds) != 0) return "pipe failed";
  const pid_t pid = ::fork();
  if (pid == 0) {
    ::close(fds[0]);
    const rlimit r{soft, hard};
    std::string out = ::setrlimit(RLIMIT_NOFILE, &r) == 0 ? body() : "setrlimit failed";
    (void)!::write(fds[1], out.data(), out.size());
    ::_exit(0);
  }
  ::close(fds[1]);
  std::string out;
  char buf[4096];
  for (ssize_t n; (n = ::read(fds[0], buf, sizeof(buf))) > 0;) out.append(buf, size_t(n));
  ::close(fds[0]);
  ::waitpid(pid, nullptr, 0);
  return out;
}

TEST(FdLimit, TheSoftLimitIsRaisedToTheHardOne) {
  const std::string out = inChild(64, 512, [] {
    const uint64_t now = fdlimit::raiseToHard();
    rlimit r{};
    ::getrlimit(RLIMIT_NOFILE, &r);
    return std::to_string(now) + " " + std::to_string(r.rlim_cur);
  });
  EXPECT_EQ(out, "512 512");
}

TEST(FdLimit, RequireSaysHowManyAreNeededAndWhichLimitToRaise) {
  const std::string out = inChild(64, 64, [] {
    try {
      fdlimit::require(100, "the test's sockets", ErrorContext::forOp("init").withRank(3));
      return std::string("no error");
    } catch (const Error& e) {
      return std::string(toString(e.code())) + ": " + e.what();
    }
  });
  EXPECT_THAT(out, HasSubstr("the test's sockets needs 100 more file descriptors"));
  EXPECT_THAT(out, HasSubstr("the open-file limit is 64 (hard limit 64)"));
  EXPECT_THAT(out, HasSubstr("ulimit -n"));
  EXPECT_THAT(out, HasSubstr("rank 3"));
  EXPECT_EQ(inChild(64, 64,
                    [] {
                      fdlimit::require(4, "a few", ErrorContext());
                      return std::string("fits");
                    }),
            "fits");
}

// A TCP context of 200 ranks needs a socket per peer: under a hard limit
// of 128 it fails at once, before listening or dialing, naming what needs
// them.
TEST(FdLimit, ATcpContextTooLargeForTheLimitFailsBeforeConnecting) {
  const std::string out = inChild(128, 128, [] {
    transport::ContextOptions o;
    o.rank = 5;
    o.size = 200;
    o.store = createHashStore();
    o.prefix = "t/";
    o.timeout = std::chrono::seconds(5);
    o.connect = "all";  // a full mesh: 199 sockets
    try {
      transport::createContext("tcp", o);
      return std::string("no error");
    } catch (const Error& e) {
      return std::string(e.what());
    }
  });
  EXPECT_THAT(out, HasSubstr("rank 5's TCP connections to 199 peers"));
  EXPECT_THAT(out, HasSubstr("the open-file limit is 128"));
}

}  // namespace
}  // namespace gflow
