// allgatherv, gatherv, scatterv, reduceScatterv and alltoallv with ranks as
// threads, against exact references, on every path a world can take (they
// run over the network transport: TCP with shared memory on or off, two
// pretend hosts, verbs on the software RDMA device), with zero counts, in
// place where allowed, async; ranks that disagree about the counts raise
// mismatch on every rank; bad counts and offsets name the problem.
#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include <numeric>
#include <optional>
#include <string>

#include "gflow/gflow.h"
#include "testing/paths.h"
#include "testing/ranks.h"
#include "testing/values.h"

namespace gflow {
namespace {

using ::testing::HasSubstr;

using testing::WorldPath;

// Rank r's count: uneven, with a zero (rank 1) where there are two ranks or more.
size_t countOf(int r, size_t scale) {
  return r == 1 ? 0 : (static_cast<size_t>(r) * 7 + 3) * scale;
}
std::vector<size_t> countsFor(int n, size_t scale) {
  std::vector<size_t> c(n);
  for (int r = 0; r < n; ++r) c[r] = countOf(r, scale);
  return c;
}
size_t sum(const std::vector<size_t>& v) {
  return std::accumulate(v.begin(), v.end(), size_t(0));
}
int64_t tagged(int from, int to, size_t i) {
  return from * 1000000007LL + to * 1000003LL + static_cast<int64_t>(i);
}

class Uneven : public testing::OnPaths {};

TEST_P(Uneven, AllgathervGathervScattervAreExact) {
  const int n = this->n();
  auto w = world();
  testing::forEachRank(w, [&](Communicator& c) {
    const int me = c.rank();
    for (size_t scale : {size_t(1), size_t(3000)}) {
      const std::vector<size_t> counts = countsFor(n, scale);
      std::vector<size_t> at(n, 0);
      for (int r = 1; r < n; ++r) at[r] = at[r - 1] + counts[r - 1];
      std::vector<int64_t> mine(counts[me]);
      for (size_t i = 0; i < mine.size(); ++i) mine[i] = tagged(me, 0, i);
      std::vector<int64_t> expect(sum(counts));
      for (int r = 0; r < n; ++r) {
        for (size_t i = 0; i < counts[r]; ++i) expect[at[r] + i] = tagged(r, 0, i);
      }
      std::vector<int64_t> all(sum(counts), -1);
      c.allgatherv(tensor(mine.data(), mine.size()), tensor(all.data(), all.size()), counts);
      ASSERT_EQ(all, expect) << "allgatherv";
      // In place: this rank's block of out is the input.
      std::vector<int64_t> all2(sum(counts), -1);
      std::copy(mine.begin(), mine.end(), all2.begin() + at[me]);
      c.allgathervAsync(tensor(all2.data() + at[me], counts[me]), tensor(all2.data(), all2.size()),
                        counts)
          .wait();
      ASSERT_EQ(all2, expect) << "allgatherv in place";
      for (int root : {0, n - 1}) {
        std::vector<int64_t> got(sum(counts), -1);
        c.gatherv(tensor(mine.data(), mine.size()),
                  me == root ? tensor(got.data(), got.size()) : Tensor{}, counts, root);
        ASSERT_EQ(got, me == root ? expect : std::vector<int64_t>(sum(counts), -1))
            << "gatherv to " << root;
        std::vector<int64_t> part(counts[me], -1);
        c.scatterv(me == root ? tensor(expect.data(), expect.size()) : Tensor{},
                   tensor(part.data(), part.size()), counts, root);
        ASSERT_EQ(part, mine) << "scatterv from " << root;
      }
    }
    EXPECT_GT(c.stats().gather, 0u);
  });
}

TEST_P(Uneven, ReduceScattervEveryDtypeAndOpIsExact) {
  const int n = this->n();
  auto w = world();
  testing::forEachRank(w, [&](Communicator& c) {
    const int me = c.rank();
    const std::vector<size_t> counts = countsFor(n, 500);
    size_t at = 0;
    for (int r = 0; r < me; ++r) at += counts[r];
    for (DataType t : testing::allDataTypes()) {
      const size_t es = dataTypeSize(t);
      for (ReduceOp op : testing::allReduceOps()) {
        if (!supportsReduceOp(t, op)) continue;
        const size_t total = sum(counts);
        std::vector<char> in(total * es), out(counts[me] * es + 1, 0x5a);
        for (size_t i = 0; i < total; ++i) {
          testing::setValue(in.data(), i, t, testing::exactInput(me, i, op, t));
        }
        c.reduceScatterv(Tensor(in.data(), total, t), Tensor(out.data(), counts[me], t), counts,
                         op);
        for (size_t i = 0; i < counts[me]; ++i) {
          ASSERT_EQ(testing::getValue(out.data(), i, t), testing::exactExpected(n, at + i, op, t))
              << toString(t) << " " << toString(op) << " i " << i;
        }
        ASSERT_EQ(out.back(), 0x5a);
      }
    }
  });
}

// Rank r sends (r + j) % 4 * scale elements to rank j (zeros included),
// from blocks laid out in reverse rank order, into blocks with gaps.
TEST_P(Uneven, AlltoallvWithCountsAndOffsetsIsExact) {
  const int n = this->n();
  auto w = world();
  testing::forEachRank(w, [&](Communicator& c) {
    const int me = c.rank();
    for (size_t scale : {size_t(1), size_t(5000)}) {
      auto cnt = [&](int from, int to) { return static_cast<size_t>((from + to) % 4) * scale; };
      std::vector<size_t> inCounts(n), inOffsets(n), outCounts(n), outOffsets(n);
      size_t at = 0;
      for (int j = n - 1; j >= 0; --j) {
        inCounts[j] = cnt(me, j);
        inOffsets[j] = at;
        at += inCounts[j];
      }
      std::vector<int64_t> in(at);
      for (int j = 0; j < n; ++j) {
        for (size_t i = 0; i < inCounts[j]; ++i) in[inOffsets[j] + i] = tagged(me, j, i);
      }
      at = 0;
      for (int j = 0; j < n; ++j) {
        outCounts[j] = cnt(j, me);
        outOffsets[j] = at + 1;  // a gap before each block
        at += outCounts[j] + 1;
      }
      std::vector<int64_t> out(at + 1, -1);
      c.alltoallv(tensor(in.data(), in.size()), inCounts, inOffsets, tensor(out.data(), out.size()),
                  outCounts, outOffsets);
      std::vector<int64_t> expect(out.size(), -1);
      for (int j = 0; j < n; ++j) {
        for (size_t i = 0; i < outCounts[j]; ++i) expect[outOffsets[j] + i] = tagged(j, me, i);
      }
      ASSERT_EQ(out, expect) << "scale " << scale;
    }
    EXPECT_EQ(c.stats().alltoall, 2u);
  });
}

INSTANTIATE_TEST_SUITE_P(Paths, Uneven,
                         ::testing::Values(std::make_tuple(WorldPath::kShm, 1),
                                           std::make_tuple(WorldPath::kShm, 3),
                                           std::make_tuple(WorldPath::kNetwork, 4),
                                           std::make_tuple(WorldPath::kTwoHosts, 5),
                                           std::make_tuple(WorldPath::kVerbs, 3)),
                         testing::pathName);

// Ranks that disagree about the counts (one rank's differ in entries that
// are not its own) raise mismatch on every rank, for every op
// whose ranks pass the same counts; an alltoallv block of another size
// than its receiver expects too.
TEST(UnevenErrors, CountsThatDisagreeRaiseMismatchOnEveryRank) {
  for (const std::string op :
       {"allgatherv", "gatherv", "scatterv", "reduceScatterv", "alltoallv"}) {
    auto res = testing::runRanksOutcomes(3, [&](Communicator& c) {
      const int me = c.rank();
      std::vector<size_t> counts = {4, 5, 6};
      // Rank 2 disagrees about ranks 0 and 1 (the same total, its own count
      // the same): only the counts themselves tell.
      if (me == 2) counts = {3, 6, 6};
      const size_t total = sum(counts);
      std::vector<float> in(16, 1.0f), out(16, 0.0f);
      auto t = [](std::vector<float>& v, size_t count) {
        return Tensor(v.data(), count, DataType::kFloat32);
      };
      if (op == "allgatherv") c.allgatherv(t(in, counts[me]), t(out, total), counts);
      if (op == "gatherv") c.gatherv(t(in, counts[me]), t(out, total), counts, 1);
      if (op == "scatterv") c.scatterv(t(in, total), t(out, counts[me]), counts, 1);
      if (op == "reduceScatterv") c.reduceScatterv(t(in, total), t(out, counts[me]), counts);
      if (op == "alltoallv") {
        // Rank 2 sends 3 elements to rank 0, which expects 2.
        std::vector<size_t> sendCounts = {2, 2, 2};
        if (me == 2) sendCounts[0] = 3;
        c.alltoallv(t(in, 9), sendCounts, {0, 3, 6}, t(out, 6), {2, 2, 2}, {0, 2, 4});
      }
      c.barrier();
    });
    for (int r = 0; r < 3; ++r) {
      ASSERT_TRUE(res[r].threw) << op << " rank " << r;
      EXPECT_EQ(res[r].code, ErrorCode::kMismatch) << op << " rank " << r << ": " << res[r].what;
    }
  }
}

TEST(UnevenErrors, BadCountsAndOffsetsNameTheProblem) {
  struct Case {
    std::function<void(Communicator&, std::vector<float>&)> call;
    const char* needle;
  };
  const std::vector<Case> cases = {
      {[](Communicator& c, std::vector<float>& v) {
         c.allgatherv(tensor(v.data(), 2), tensor(v.data() + 4, 4), {2});
       },
       "counts has 1 entries, not one per rank (2)"},
      {[](Communicator& c, std::vector<float>& v) {
         c.allgatherv(tensor(v.data(), 3), tensor(v.data() + 4, 4), {2, 2});
       },
       "in.count (3) must be counts[rank] (2)"},
      {[](Communicator& c, std::vector<float>& v) {
         c.alltoallv(tensor(v.data(), 4), {2, 2}, {0, 3}, tensor(v.data() + 8, 4), {2, 2}, {0, 2});
       },
       "in block 1 [3, +2) is outside its tensor (4 elements)"},
      {[](Communicator& c, std::vector<float>& v) {
         c.alltoallv(tensor(v.data(), 4), {2, 2}, {0, 2}, tensor(v.data() + 8, 4), {2, 2}, {0, 1});
       },
       "out blocks 0 and 1 overlap"},
      {[](Communicator& c, std::vector<float>& v) {
         c.alltoallv(tensor(v.data(), 4), {2, 2}, {0, 2}, tensor(v.data() + 8, 4), {1, 1}, {0, 1});
       },
       "inCounts[rank] (2) must equal outCounts[rank] (1)"},
      {[](Communicator& c, std::vector<float>& v) {
         c.scatterv(tensor(v.data(), 4), tensor(v.data() + 8, 2), {2, 2}, 5);
       },
       "root 5 is outside [0, 2)"},
  };
  for (const Case& k : cases) {
    auto res = testing::runRanksOutcomes(2, [&](Communicator& c) {
      std::vector<float> v(16, 1.0f);
      if (c.rank() == 0) {
        k.call(c, v);
      } else {
        c.barrier();
      }
    });
    ASSERT_TRUE(res[0].threw) << k.needle;
    EXPECT_EQ(res[0].code, ErrorCode::kInvalidArgument) << res[0].what;
    EXPECT_THAT(res[0].what, HasSubstr(k.needle));
    // Rank 0's call is rejected; rank 1 runs another op as that number.
    ASSERT_TRUE(res[1].threw) << k.needle;
    EXPECT_EQ(res[1].code, ErrorCode::kMismatch) << res[1].what;
    EXPECT_THAT(res[1].what, HasSubstr(k.needle));
  }
}

}  // namespace
}  // namespace gflow
