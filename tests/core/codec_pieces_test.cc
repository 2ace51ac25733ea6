// A compressed allreduce of host data cut into pieces (GFLOW_CODEC_PIECE,
// core/compressed_allreduce.h codecPieces): where the cuts fall, the
// joined completion of the pieces (WorkState), and that an op in pieces
// gives the bits of its pieces run as ops of their own.
#include <gtest/gtest.h>
#include <sys/resource.h>

#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstring>
#include <limits>
#include <random>

#include "core/compressed_allreduce.h"
#include "core/executor.h"
#include "gflow/gflow.h"
#include "testing/ranks.h"

namespace gflow {
namespace {

using namespace std::chrono_literals;
using internal::codecPieces;

TEST(CodecPieces, CutOnBlocksIntoPiecesOfAboutTheSize) {
  const uint64_t mib = 1 << 20;
  struct Case {
    size_t count;
    uint64_t pieceBytes;
    size_t pieces;
  };
  // count float32 values (4 bytes each); pieces: the nearest whole number.
  const Case cases[] = {{8 * mib / 4, 8 * mib, 1},
                        {12 * mib / 4 - 1, 8 * mib, 1},
                        {12 * mib / 4, 8 * mib, 2},
                        {31500000 / 4, 8 * mib, 4},
                        {26300000 / 4, 8 * mib, 3},
                        {1000, 65536, 1},
                        {50000, 65536, 3},
                        {1000003, 65536, 61},
                        {300, 65536, 1},
                        {0, 65536, 1},
                        {64 * mib, 0, 1}};
  for (const Case& c : cases) {
    const std::vector<size_t> cuts = codecPieces(c.count, c.pieceBytes);
    ASSERT_EQ(cuts.size(), c.pieces + 1) << c.count << " values, pieces of " << c.pieceBytes;
    EXPECT_EQ(cuts.front(), 0u);
    EXPECT_EQ(cuts.back(), c.count);
    size_t shortest = c.count, longest = 0;
    for (size_t i = 0; i + 1 < cuts.size(); ++i) {
      EXPECT_EQ(cuts[i] % kQuantBlock, 0u) << "piece " << i << " of " << c.count;
      if (c.count > 0) {
        ASSERT_LT(cuts[i], cuts[i + 1]) << "piece " << i;
      }
      shortest = std::min(shortest, cuts[i + 1] - cuts[i]);
      longest = std::max(longest, cuts[i + 1] - cuts[i]);
    }
    if (c.pieces > 1) {
      EXPECT_LE(longest - shortest, kQuantBlock) << c.count;
    }
  }
  // Fewer values than blocks asked for: one block a piece at most.
  EXPECT_EQ(codecPieces(3 * kQuantBlock, 256).size(), 4u);
}

std::shared_ptr<const Error> failure(const char* what) {
  return std::make_shared<Error>(ErrorCode::kPeerLost, what);
}

TEST(CodecPieces, TheLastPiecesWorkEndsWithEveryPieceAndRaisesTheFirstError) {
  auto a = std::make_shared<WorkState>(), b = std::make_shared<WorkState>();
  auto last = std::make_shared<WorkState>();
  last->setEarlierPieces({a, b});
  last->finish(nullptr);
  EXPECT_FALSE(last->done());
  EXPECT_THROW(last->wait(20ms), Error);  // a and b still run: a timeout
  b->finish(failure("piece b"));
  a->finish(nullptr);
  EXPECT_TRUE(last->done());
  try {
    last->wait(0ms);
    FAIL() << "no error";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("piece b"), std::string::npos) << e.what();
  }
  // The first failing piece's error, whatever ends last.
  auto c = std::make_shared<WorkState>(), d = std::make_shared<WorkState>();
  auto end = std::make_shared<WorkState>();
  end->setEarlierPieces({c, d});
  end->finish(failure("piece end"));
  d->finish(failure("piece d"));
  c->finish(failure("piece c"));
  try {
    end->wait(1s);
    FAIL() << "no error";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("piece c"), std::string::npos) << e.what();
  }
}

struct Buffers {
  std::vector<float> x, y, rx;
  bool nonFinite = false;
  uint64_t ops = 0;  // the allreduces the op on x ran as
};

Buffers inputs(int rank, size_t n) {
  Buffers b;
  std::mt19937 rng(static_cast<uint32_t>(31 + rank));
  std::normal_distribution<float> d(0.0f, 1.0f);
  for (size_t i = 0; i < n; ++i) {
    b.x.push_back(d(rng));
    b.y.push_back(d(rng));
  }
  b.rx.assign(n, 0.0f);
  return b;
}

// An async qint8 avg with error feedback on x, then a float16 sum on y
// with an inf in its last values (on rank 1), each on the whole buffer
// (`cuts` empty) or one op per piece at `cuts`, async or blocking.
std::vector<Buffers> runOps(int ranks, size_t n, uint64_t pieceBytes, bool async,
                            const std::vector<size_t>& cuts) {
  std::vector<Buffers> out(ranks);
  Options base;
  base.tuning.codecPieceBytes = pieceBytes;
  testing::runRanks(
      ranks,
      [&](Communicator& comm) {
        Buffers b = inputs(comm.rank(), n);
        if (comm.rank() == 1) b.y[n - 1] = std::numeric_limits<float>::infinity();
        AllreduceOptions q8, f16;
        q8.wire = DataType::kQInt8;
        q8.op = ReduceOp::kAvg;
        f16.wire = DataType::kFloat16;
        const std::vector<size_t> at = cuts.empty() ? std::vector<size_t>{0, n} : cuts;
        auto run = [&](const Tensor& t, const AllreduceOptions& o) {
          if (!async) return comm.allreduce(t, o).nonFinite;
          Work w = comm.allreduceAsync(t, o);
          w.wait();
          return w.nonFinite();
        };
        const uint64_t before = comm.stats().allreduce;
        for (size_t i = 0; i + 1 < at.size(); ++i) {
          q8.residual = tensor(b.rx.data() + at[i], at[i + 1] - at[i]);
          run(tensor(b.x.data() + at[i], at[i + 1] - at[i]), q8);
        }
        b.ops = comm.stats().allreduce - before;
        for (size_t i = 0; i + 1 < at.size(); ++i) {
          if (run(tensor(b.y.data() + at[i], at[i + 1] - at[i]), f16)) b.nonFinite = true;
        }
        out[comm.rank()] = std::move(b);
      },
      base);
  return out;
}

// 50000 values in pieces of 64 KiB: three collectives, whose bits are
// those of the three pieces run as ops of their own, blocking or async;
// the inf/NaN flag covers every piece. Without the cut the op is one
// collective and its ring cuts its segments elsewhere.
TEST(CodecPiecesAllreduce, AnOpInPiecesGivesTheBitsOfItsPiecesRunAlone) {
  const int ranks = 3;
  const size_t n = 50000;
  const std::vector<size_t> cuts = codecPieces(n, 65536);
  ASSERT_EQ(cuts.size(), 4u);
  const auto alone = runOps(ranks, n, 0, false, cuts);
  for (bool async : {false, true}) {
    const auto cut = runOps(ranks, n, 65536, async, {});
    for (int r = 0; r < ranks; ++r) {
      EXPECT_EQ(cut[r].ops, 3u) << "rank " << r;
      EXPECT_EQ(std::memcmp(alone[r].x.data(), cut[r].x.data(), n * sizeof(float)), 0) << r;
      EXPECT_EQ(std::memcmp(alone[r].rx.data(), cut[r].rx.data(), n * sizeof(float)), 0) << r;
      EXPECT_EQ(std::memcmp(alone[r].y.data(), cut[r].y.data(), n * sizeof(float)), 0) << r;
      EXPECT_TRUE(cut[r].nonFinite) << "rank " << r << (async ? " async" : " blocking");
    }
  }
  // The reference: the average within qint8's error of the float64 one.
  std::vector<Buffers> in;
  for (int r = 0; r < ranks; ++r) in.push_back(inputs(r, n));
  for (size_t i = 0; i < n; i += 97) {
    double avg = 0;
    for (int r = 0; r < ranks; ++r) avg += in[r].x[i] / ranks;
    EXPECT_NEAR(alone[0].x[i], avg, 0.1) << i;
  }
  // With pieces off, one collective.
  EXPECT_EQ(runOps(ranks, n, 0, true, {})[0].ops, 1u);
}

// Ranks that pass different counts whose pieces have one size: each
// piece names the whole op's count and its place, so the first piece
// raises kMismatch on every rank instead of pairing rank 1's third piece
// with rank 0's next op. Without a cut the counts differ anyway.
TEST(CodecPiecesAllreduce, DifferentCountsCutIntoEqualPiecesRaiseMismatch) {
  Options o;
  o.tuning.codecPieceBytes = 65536;  // 16384 floats a piece
  const auto res = testing::runRanksOutcomes(
      2,
      [](Communicator& comm) {
        std::vector<float> x(comm.rank() == 0 ? 2 * 16384 : 3 * 16384, 1.0f);
        AllreduceOptions q8;
        q8.wire = DataType::kQInt8;
        comm.allreduce(tensor(x.data(), x.size()), q8);
        comm.barrier();  // a rank whose own call completed learns at the next call
      },
      o);
  for (int r = 0; r < 2; ++r) {
    ASSERT_TRUE(res[r].threw) << "rank " << r;
    EXPECT_EQ(res[r].code, ErrorCode::kMismatch) << "rank " << r << ": " << res[r].what;
    EXPECT_NE(res[r].what.find("piece digest"), std::string::npos) << res[r].what;
  }
}

// Caps this process's address space for a scope (RLIMIT_AS), so that an
// allocation beyond it fails whatever the machine's overcommit policy.
class AddressSpaceCap {
 public:
  explicit AddressSpaceCap(rlim_t bytes) {
    getrlimit(RLIMIT_AS, &old_);
    rlimit cap = old_;
    cap.rlim_cur = std::min(bytes, old_.rlim_max);
    setrlimit(RLIMIT_AS, &cap);
  }
  ~AddressSpaceCap() { setrlimit(RLIMIT_AS, &old_); }

 private:
  rlimit old_{};
};

// Wire scratch that cannot be had (8 TiB of qint8 for a count of 2^43,
// over a 4 TiB cap; one collective, none of the data read) fails the call
// and the communicator as a gflow::Error, so no peer would wait for this
// rank's op.
TEST(CodecPiecesAllreduce, WireScratchThatCannotBeHadFailsTheCommunicator) {
#if defined(__SANITIZE_ADDRESS__) || defined(__SANITIZE_THREAD__)
  GTEST_SKIP() << "the sanitizer's allocator ends the process on an allocation it cannot serve";
#endif
  const AddressSpaceCap cap(rlim_t{1} << 42);
  Options o;
  o.tuning.codecPieceBytes = 0;
  const auto res = testing::runRanksOutcomes(
      2,
      [](Communicator& comm) {
        std::vector<float> x(16, 1.0f);
        AllreduceOptions q8;
        q8.wire = DataType::kQInt8;
        try {
          comm.allreduce(tensor(x.data(), size_t{1} << 43), q8);
          ADD_FAILURE() << "8 TiB of scratch on rank " << comm.rank();
        } catch (const Error& e) {
          EXPECT_NE(std::string(e.what()).find("scratch or kernels"), std::string::npos)
              << e.what();
        } catch (const std::exception& e) {
          ADD_FAILURE() << "not a gflow::Error: " << e.what();
        }
        comm.allreduce(tensor(x.data(), x.size()));  // the communicator failed
      },
      o);
  for (int r = 0; r < 2; ++r) EXPECT_TRUE(res[r].threw) << "rank " << r;
}

}  // namespace
}  // namespace gflow
