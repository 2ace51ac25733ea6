// A rank that closes its TCP context with bytes it never read must not
// destroy what it sent before: the kernel answers such a close with a
// reset, and a reset can discard the data its peer has not read yet. Rank 0
// sends its last message and leaves without reading a message rank 1 sent
// it (held back by the unexpected limit, so it sits unread in the socket);
// rank 1 reads rank 0's message only after rank 0 has gone. With the
// graceful close (TcpContext::closeGracefully: shutdown, then read to the
// peer's FIN, bounded) the message arrives; without it, rank 1 fails with
// "reset the connection".
#include <gtest/gtest.h>

#include <chrono>
#include <thread>
#include <vector>

#include "common/deadline.h"
#include "testing/contexts.h"

namespace gflow {
namespace {

using std::chrono::milliseconds;

constexpr transport::Envelope kEnv{{7, 7, 7}};

TEST(TcpTeardown, ALastMessageArrivesThoughItsSenderLeftBytesUnread) {
  ProgressOptions progress;
  progress.unexpectedLimitBytes = 1;  // rank 0 stops reading rank 1's message
  auto errors = testing::runContexts(
      "tcp", 2,
      [](transport::Context& c) {
        const std::vector<char> last = testing::pattern(4096, 1);
        if (c.rank() == 0) {
          c.beginGroup(1, kEnv);
          c.wait(c.isend(1, last.data(), last.size(), {1, 0}, kEnv),
                 Deadline::after(milliseconds(5000)));
          std::this_thread::sleep_for(milliseconds(100));  // rank 1's message is in the socket
          return;                                          // leaves it unread
        }
        c.beginGroup(1, kEnv);
        const std::vector<char> unread = testing::pattern(32768, 2);
        auto s = c.isend(0, unread.data(), unread.size(), {1, 1}, kEnv);
        std::this_thread::sleep_for(milliseconds(400));  // rank 0 has gone
        std::vector<char> got(last.size());
        c.wait(c.irecv(0, got.data(), got.size(), {1, 0}, kEnv),
               Deadline::after(milliseconds(5000)));
        EXPECT_EQ(got, last);
        (void)s;
      },
      milliseconds(5000), progress);
  for (int r = 0; r < 2; ++r) {
    if (errors[r]) ADD_FAILURE() << "rank " << r << ": " << testing::errorOf(errors[r]).what();
  }
}

}  // namespace
}  // namespace gflow
