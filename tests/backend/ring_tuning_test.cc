// The ring tuning a host backend runs with: Options::tuning.pieceBytes and
// ringWindow win over GFLOW_PIECE_BYTES and GFLOW_RING_WINDOW.
#include <gtest/gtest.h>

#include "backend/host/exchange.h"
#include "testing/scoped_env.h"

namespace gflow::backend::host {
namespace {

TEST(RingTuning, OptionsWinOverTheEnvironment) {
  testing::ScopedEnv piece("GFLOW_PIECE_BYTES", "1K");
  testing::ScopedEnv window("GFLOW_RING_WINDOW", "3");
  const RingTuning fromEnv = ringTuning(TuningOptions{});
  EXPECT_EQ(fromEnv.pieceBytes, 1024u);
  EXPECT_EQ(fromEnv.window, 3u);
  TuningOptions given;
  given.pieceBytes = 8192;
  given.ringWindow = 5;
  const RingTuning t = ringTuning(given);
  EXPECT_EQ(t.pieceBytes, 8192u);
  EXPECT_EQ(t.window, 5u);
}

}  // namespace
}  // namespace gflow::backend::host
