// Options over the environment, per communicator (core/settings.h): each
// field set in Options wins over a contrary GFLOW_* value, is checked, takes
// part in the creation-time agreement with the value in force, and passes
// to split()'s communicators.
#include <gtest/gtest.h>

#include <functional>
#include <string>
#include <vector>

#include "core/settings.h"
#include "gflow/gflow.h"
#include "testing/contexts.h"
#include "testing/ranks.h"
#include "testing/scoped_env.h"

namespace gflow {
namespace {

using testing::ScopedEnv;

uint64_t messagesSent(const Stats& s) {
  uint64_t n = 0;
  for (const PeerStats& p : s.peers) n += p.messagesSent;
  return n;
}

// Bytes and messages one allreduce of `count` floats sends from this rank.
struct Sent {
  uint64_t bytes = 0;
  uint64_t messages = 0;
};
Sent sentByAllreduce(Communicator& c, size_t count) {
  std::vector<float> v(count, 1.0f);
  const Stats before = c.stats();
  c.allreduce(tensor(v.data(), v.size()));
  const Stats after = c.stats();
  EXPECT_EQ(v[count - 1], static_cast<float>(c.size()));
  return Sent{after.bytesSent() - before.bytesSent(), messagesSent(after) - messagesSent(before)};
}

// Rank 0's Sent of one allreduce in a world of `n` made from `optionsOf`.
Sent rankZeroSent(int n, size_t count, const std::function<Options(int)>& optionsOf) {
  auto world = testing::makeWorldWith(n, optionsOf);
  std::vector<Sent> sent(n);
  testing::forEachRank(world, [&](Communicator& c) { sent[c.rank()] = sentByAllreduce(c, count); });
  return sent[0];
}

std::function<Options(int)> same(const Options& o) {
  return [o](int) { return o; };
}

// Each rank's creation error ("" where it succeeded), as "code: what".
std::vector<std::string> createErrors(int n, const std::function<Options(int)>& optionsOf) {
  auto errs = testing::onThreads(n, [&](int r, const std::shared_ptr<Store>& store) {
    Options o = optionsOf(r);
    o.rank = r;
    o.size = n;
    o.store = store;
    Communicator::create(o);
  });
  std::vector<std::string> out(n);
  for (int r = 0; r < n; ++r) {
    if (!errs[r]) continue;
    const Error e = testing::errorOf(errs[r]);
    out[r] = std::string(toString(e.code())) + ": " + e.what();
  }
  return out;
}

// Rank 0 gets `set(options)`, the others the environment.
std::function<Options(int)> onRankZero(const std::function<void(Options&)>& set) {
  return [set](int r) {
    Options o;
    if (r == 0) set(o);
    return o;
  };
}

void expectEveryRankNames(const std::vector<std::string>& errors, const std::string& what) {
  for (size_t r = 0; r < errors.size(); ++r) {
    EXPECT_NE(errors[r].find("invalid_argument"), std::string::npos)
        << "rank " << r << ": " << errors[r];
    EXPECT_NE(errors[r].find(what), std::string::npos) << "rank " << r << ": " << errors[r];
  }
}

void expectNoneFailed(const std::vector<std::string>& errors) {
  for (size_t r = 0; r < errors.size(); ++r) EXPECT_EQ(errors[r], "") << "rank " << r;
}

TEST(Settings, ShmEnabledFromOptionsWinsOverTheEnvironment) {
  for (bool enabled : {false, true}) {
    ScopedEnv shm("GFLOW_SHM", enabled ? "0" : "1");
    Options o;
    o.shm.enabled = enabled;
    testing::runRanks(
        2,
        [&](Communicator& c) {
          sentByAllreduce(c, 64);
          const Stats s = c.stats();
          EXPECT_EQ(s.sharedMemoryOps, enabled ? 1u : 0u);
          EXPECT_EQ(s.networkOps, enabled ? 0u : 1u);
        },
        o);
  }
}

TEST(Settings, SplitInheritsTheParentsSettings) {
  ScopedEnv shm("GFLOW_SHM", "1");
  Options o;
  o.shm.enabled = false;
  testing::runRanks(
      2,
      [&](Communicator& c) {
        auto child = c.split(0, c.rank());
        ASSERT_TRUE(child);
        sentByAllreduce(*child, 64);
        EXPECT_EQ(child->stats().sharedMemoryOps, 0u);
        EXPECT_EQ(child->stats().networkOps, 1u);
      },
      o);
}

// Recursive doubling on 4 ranks sends the whole vector twice; the ring sends
// 2 * 3/4 of it.
TEST(Settings, RdMaxBytesFromOptionsPicksTheAlgorithm) {
  ScopedEnv rd("GFLOW_RD_MAX_BYTES", "1");  // the environment says: ring
  constexpr size_t kCount = 16384;
  constexpr uint64_t kBytes = kCount * 4;
  Options o;
  o.shm.enabled = false;
  EXPECT_LT(rankZeroSent(4, kCount, same(o)).bytes, 2 * kBytes);
  o.tuning.rdMaxBytes = 1 << 20;
  EXPECT_GE(rankZeroSent(4, kCount, same(o)).bytes, 2 * kBytes);
}

TEST(Settings, PieceBytesFromOptionsSetsTheRingPieces) {
  ScopedEnv piece("GFLOW_PIECE_BYTES", "1K");
  Options o;
  o.shm.enabled = false;
  o.algorithm = "ring";
  const uint64_t small = rankZeroSent(2, 16384, same(o)).messages;
  o.tuning.pieceBytes = 64 << 10;
  const uint64_t large = rankZeroSent(2, 16384, same(o)).messages;
  EXPECT_GE(small, 32u);
  EXPECT_LE(large, 4u);
}

// Two hosts of two ranks: each segment of the hierarchical allreduce is one
// cross-host allreduce.
TEST(Settings, HierSegmentBytesFromOptionsSetsTheSegments) {
  ScopedEnv segment("GFLOW_HIER_SEGMENT", "4K");
  Options o;
  o.algorithm = "hier";
  const uint64_t small = rankZeroSent(4, 16384, testing::onHosts({0, 0, 1, 1}, o)).messages;
  o.tuning.hierSegmentBytes = 1 << 20;
  const uint64_t large = rankZeroSent(4, 16384, testing::onHosts({0, 0, 1, 1}, o)).messages;
  EXPECT_GE(small, 16u);
  EXPECT_LT(large * 4, small);
}

TEST(Settings, InvalidOptionValuesAreRefusedNamingTheField) {
  const std::vector<std::pair<std::function<void(Options&)>, std::string>> cases = {
      {[](Options& o) { o.shm.chunkBytes = 100; }, "Options::shm.chunkBytes"},
      {[](Options& o) { o.tuning.pieceBytes = 8; }, "Options::tuning.pieceBytes"},
      {[](Options& o) { o.tuning.ringWindow = 0; }, "Options::tuning.ringWindow"},
      {[](Options& o) { o.tuning.hierSegmentBytes = 1; }, "Options::tuning.hierSegmentBytes"},
      {[](Options& o) { o.tuning.codecPieceBytes = 4096; }, "Options::tuning.codecPieceBytes"},
      {[](Options& o) { o.progress.unexpectedLimitBytes = 0; },
       "Options::progress.unexpectedLimitBytes"},
      {[](Options& o) { o.progress.spinUs = -1; }, "Options::progress.spinUs"},
      {[](Options& o) { o.progress.priority = 40; }, "Options::progress.priority"},
      {[](Options& o) { o.progress.priority = -40; }, "Options::progress.priority"},
      {[](Options& o) { o.device.backend = "gpu"; }, "Options::device.backend"},
      {[](Options& o) { o.shm.singleCopy = "32M-1M"; }, "Options::shm.singleCopy"},
      {[](Options& o) { o.shm.singleCopy = "on"; }, "Options::shm.singleCopy"},
  };
  for (const auto& [set, field] : cases) {
    Options o;
    set(o);
    expectEveryRankNames(createErrors(2, same(o)), field);
  }
}

TEST(Settings, MalformedSingleCopyRangeInTheEnvironmentIsRefusedNamingIt) {
  for (const char* bad : {"lots", "1M", "4M-1M", "1X-"}) {
    ScopedEnv range("GFLOW_SHM_SINGLE_COPY", bad);
    expectEveryRankNames(createErrors(2, same(Options{})), "GFLOW_SHM_SINGLE_COPY is '");
  }
}

TEST(Settings, AgreementComparesTheValuesInForce) {
  ScopedEnv chunk("GFLOW_SHM_CHUNK", "4K");
  ScopedEnv rd("GFLOW_RD_MAX_BYTES", "64K");
  ScopedEnv shm("GFLOW_SHM", "1");
  ScopedEnv device("GFLOW_DEVICE_BACKEND", "auto");
  // Set differently through Options on rank 0 than through the environment.
  expectEveryRankNames(createErrors(3, onRankZero([](Options& o) { o.shm.chunkBytes = 8192; })),
                       "GFLOW_SHM_CHUNK (Options::shm.chunkBytes) differs");
  expectEveryRankNames(createErrors(3, onRankZero([](Options& o) { o.shm.enabled = false; })),
                       "GFLOW_SHM (Options::shm.enabled) differs");
  expectEveryRankNames(createErrors(3, onRankZero([](Options& o) { o.tuning.rdMaxBytes = 4096; })),
                       "GFLOW_RD_MAX_BYTES (Options::tuning.rdMaxBytes) differs");
  expectEveryRankNames(createErrors(3, onRankZero([](Options& o) { o.device.backend = "staged"; })),
                       "GFLOW_DEVICE_BACKEND (Options::device.backend) differs");
  expectEveryRankNames(createErrors(3, onRankZero([](Options& o) { o.device.verifyOps = false; })),
                       "GFLOW_NCCL_VERIFY (Options::device.verifyOps) differs");
  expectEveryRankNames(createErrors(3, onRankZero([](Options& o) { o.shm.singleCopy = "off"; })),
                       "GFLOW_SHM_SINGLE_COPY (Options::shm.singleCopy) differs");
  expectEveryRankNames(createErrors(3, onRankZero([](Options& o) { o.reproducible = true; })),
                       "GFLOW_REPRODUCIBLE (Options::reproducible) differs");
  // Ranks that cut compressed ops differently would run different ops.
  expectEveryRankNames(
      createErrors(3, onRankZero([](Options& o) { o.tuning.codecPieceBytes = 0; })),
      "GFLOW_CODEC_PIECE (Options::tuning.codecPieceBytes) differs");
  // The same values, one way or the other, agree.
  expectNoneFailed(createErrors(3, onRankZero([](Options& o) {
                                  o.shm.chunkBytes = 4096;
                                  o.shm.enabled = true;
                                  o.tuning.rdMaxBytes = 65536;
                                  o.device.backend = "auto";
                                  o.device.verifyOps = true;
                                })));
}

// Every kAgree parameter of the registry has its value in force, under its
// Options field.
TEST(Settings, AgreedCoversEveryAgreedParameter) {
  const Settings s = resolveSettings(Options{});
  std::string names;
  for (const Settings::Agreed& a : s.agreed()) {
    names += std::string(names.empty() ? "" : ", ") + a.param->name;
    EXPECT_EQ(std::string(a.field).rfind("Options::", 0), 0u) << a.field;
  }
  EXPECT_EQ(names, params::agreementNames());
}

}  // namespace
}  // namespace gflow
