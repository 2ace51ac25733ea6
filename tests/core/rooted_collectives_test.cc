// Reduce, gather, scatter and all-to-all against exact references, on every
// host path a world can take: shared memory (one host), the network
// transport's algorithms (shared memory off), and several hosts (the
// rooted ops and all-to-all run flat across them). Sizes cross the
// selection's tree/linear threshold, so both algorithms of each op run.
#include <gtest/gtest.h>

#include <cstring>
#include <string>
#include <tuple>

#include "gflow/gflow.h"
#include "testing/ranks.h"
#include "testing/values.h"

namespace gflow {
namespace {

enum class Path { kShm, kNetwork, kTwoHosts };

std::vector<std::shared_ptr<Communicator>> worldOn(Path p, int n) {
  Options o;
  if (p == Path::kNetwork) o.shm.enabled = false;
  if (p != Path::kTwoHosts) return testing::makeWorld(n, o);
  std::vector<int> hostOf(n);
  for (int r = 0; r < n; ++r) hostOf[r] = r < (n + 1) / 2 ? 0 : 1;
  return testing::makeWorldWith(n, testing::onHosts(hostOf, o));
}

class Rooted : public ::testing::TestWithParam<std::tuple<Path, int>> {
 protected:
  std::vector<std::shared_ptr<Communicator>> world() {
    return worldOn(std::get<0>(GetParam()), std::get<1>(GetParam()));
  }
  int n() const { return std::get<1>(GetParam()); }
};

// Values that tell rank, block and element apart.
int64_t tagged(int rank, size_t block, size_t i) {
  return rank * 1000000007LL + static_cast<int64_t>(block) * 1000003 + static_cast<int64_t>(i);
}

TEST_P(Rooted, ReduceEveryDtypeOpLandsOnTheRootOnly) {
  const int n = this->n();
  auto w = world();
  testing::forEachRank(w, [&](Communicator& c) {
    for (int root : {0, n - 1}) {
      for (DataType t : testing::allDataTypes()) {
        const size_t es = dataTypeSize(t);
        for (ReduceOp op : testing::allReduceOps()) {
          if (!supportsReduceOp(t, op)) continue;
          for (size_t count : {size_t(0), size_t(3), size_t(1037), size_t(20000)}) {
            std::vector<char> in(count * es + 1), out(count * es + 1, 0x5a);
            for (size_t i = 0; i < count; ++i) {
              testing::setValue(in.data(), i, t, testing::exactInput(c.rank(), i, op, t));
            }
            const std::vector<char> inBefore = in;
            c.reduce(Tensor(in.data(), count, t), Tensor(out.data(), count, t), root, op);
            ASSERT_EQ(in, inBefore) << "reduce wrote its input";
            if (c.rank() != root) {
              ASSERT_EQ(out, std::vector<char>(count * es + 1, 0x5a)) << "non-root out written";
              continue;
            }
            for (size_t i = 0; i < count; ++i) {
              ASSERT_EQ(testing::getValue(out.data(), i, t), testing::exactExpected(n, i, op, t))
                  << toString(t) << " " << toString(op) << " count " << count << " i " << i;
            }
            ASSERT_EQ(out.back(), 0x5a) << "reduce wrote past out";
          }
        }
      }
    }
  });
}

TEST_P(Rooted, ReduceInPlaceFromEveryRoot) {
  const int n = this->n();
  auto w = world();
  testing::forEachRank(w, [&](Communicator& c) {
    for (int root = 0; root < n; ++root) {
      for (size_t count : {size_t(1), size_t(70000)}) {
        std::vector<double> v(count);
        for (size_t i = 0; i < count; ++i) v[i] = c.rank() + 0.25 * static_cast<double>(i % 64);
        const std::vector<double> before = v;
        c.reduce(tensor(v.data(), count), root, ReduceOp::kSum);
        for (size_t i = 0; i < count; ++i) {
          const double expect = c.rank() == root
                                    ? n * (n - 1) / 2.0 + n * 0.25 * static_cast<double>(i % 64)
                                    : before[i];
          ASSERT_EQ(v[i], expect) << "root " << root << " i " << i;
        }
      }
    }
  });
}

TEST_P(Rooted, GatherFromEveryRootInAndOutOfPlace) {
  const int n = this->n();
  auto w = world();
  testing::forEachRank(w, [&](Communicator& c) {
    for (int root = 0; root < n; ++root) {
      for (size_t block : {size_t(0), size_t(1), size_t(7), size_t(5000)}) {
        for (bool inPlace : {false, true}) {
          std::vector<int64_t> in(block), out(block * n + 1, -1);
          for (size_t i = 0; i < block; ++i) in[i] = tagged(c.rank(), 0, i);
          const bool atRoot = c.rank() == root;
          if (inPlace && atRoot) {
            std::copy(in.begin(), in.end(), out.begin() + root * block);
            c.gather(tensor(out.data() + root * block, block), tensor(out.data(), block * n), root);
          } else {
            // Off the root `out` is not used: an empty tensor will do.
            c.gather(tensor(in.data(), block), atRoot ? tensor(out.data(), block * n) : Tensor{},
                     root);
          }
          ASSERT_EQ(out.back(), -1);
          for (int r = 0; r < n && atRoot; ++r) {
            for (size_t i = 0; i < block; ++i) {
              ASSERT_EQ(out[r * block + i], tagged(r, 0, i)) << "root " << root << " from " << r;
            }
          }
        }
      }
    }
  });
}

TEST_P(Rooted, ScatterFromEveryRootInAndOutOfPlace) {
  const int n = this->n();
  auto w = world();
  testing::forEachRank(w, [&](Communicator& c) {
    for (int root = 0; root < n; ++root) {
      for (size_t block : {size_t(0), size_t(1), size_t(7), size_t(5000)}) {
        for (bool inPlace : {false, true}) {
          const bool atRoot = c.rank() == root;
          std::vector<int64_t> in(block * n), out(block + 1, -1);
          for (int j = 0; j < n && atRoot; ++j) {
            for (size_t i = 0; i < block; ++i) in[j * block + i] = tagged(root, j, i);
          }
          const std::vector<int64_t> inBefore = in;
          if (inPlace && atRoot) {
            c.scatter(tensor(in.data(), block * n), tensor(in.data() + root * block, block), root);
            ASSERT_EQ(in, inBefore);
            continue;
          }
          c.scatter(atRoot ? tensor(in.data(), block * n) : Tensor{}, tensor(out.data(), block),
                    root);
          ASSERT_EQ(out.back(), -1);
          for (size_t i = 0; i < block; ++i) ASSERT_EQ(out[i], tagged(root, c.rank(), i));
          ASSERT_EQ(in, inBefore) << "scatter wrote its input";
        }
      }
    }
  });
}

TEST_P(Rooted, AlltoallEveryBlockReachesItsRank) {
  const int n = this->n();
  auto w = world();
  testing::forEachRank(w, [&](Communicator& c) {
    for (size_t block : {size_t(0), size_t(1), size_t(9), size_t(3000), size_t(40000)}) {
      std::vector<int64_t> in(block * n), out(block * n + 1, -1);
      for (int j = 0; j < n; ++j) {
        for (size_t i = 0; i < block; ++i) in[j * block + i] = tagged(c.rank(), j, i);
      }
      c.alltoall(tensor(in.data(), block * n), tensor(out.data(), block * n));
      ASSERT_EQ(out.back(), -1);
      for (int j = 0; j < n; ++j) {
        for (size_t i = 0; i < block; ++i) {
          ASSERT_EQ(out[j * block + i], tagged(j, c.rank(), i)) << "from " << j << " i " << i;
        }
      }
    }
  });
}

TEST_P(Rooted, AsyncFormsAndStatsCount) {
  const int n = this->n();
  auto w = world();
  testing::forEachRank(w, [&](Communicator& c) {
    const Stats before = c.stats();
    std::vector<int32_t> a(n * 4, c.rank()), b(n * 4, -1), s(4, c.rank() + 1), g(n * 4, -1);
    Work w1 = c.alltoallAsync(tensor(a.data(), a.size()), tensor(b.data(), b.size()));
    Work w2 = c.reduceAsync(tensor(s.data(), s.size()), 0, ReduceOp::kMax);
    Work w3 = c.gatherAsync(tensor(a.data(), 4), tensor(g.data(), g.size()), n - 1);
    w3.wait();
    w2.wait();
    w1.wait();
    for (int j = 0; j < n; ++j) EXPECT_EQ(b[j * 4], j);
    if (c.rank() == 0) {
      EXPECT_EQ(s[0], n);
    }
    const Stats after = c.stats();
    EXPECT_EQ(after.alltoall, before.alltoall + 1);
    EXPECT_EQ(after.reduce, before.reduce + 1);
    EXPECT_EQ(after.gather, before.gather + 1);
  });
}

INSTANTIATE_TEST_SUITE_P(Paths, Rooted,
                         ::testing::Combine(::testing::Values(Path::kShm, Path::kNetwork,
                                                              Path::kTwoHosts),
                                            ::testing::Values(1, 2, 3, 5, 8)),
                         [](const ::testing::TestParamInfo<Rooted::ParamType>& i) {
                           const Path p = std::get<0>(i.param);
                           return std::string(p == Path::kShm       ? "shm"
                                              : p == Path::kNetwork ? "network"
                                                                    : "twohosts") +
                                  "_" + std::to_string(std::get<1>(i.param));
                         });

// Arguments that differ between ranks fail the op on every rank with
// kMismatch (never a hang or a wrong result); bad arguments on one rank
// fail it everywhere with kInvalidArgument naming that rank.
TEST(RootedErrors, DifferentRootsOrCountsAreAMismatchEverywhere) {
  for (Path p : {Path::kShm, Path::kNetwork}) {
    for (int which : {0, 1, 2}) {
      auto w = worldOn(p, 3);
      std::vector<ErrorCode> codes(3, ErrorCode::kInternal);
      std::vector<std::string> what(3);
      testing::forEachRank(w, [&](Communicator& c) {
        std::vector<float> in(6, 1.0f), out(18, 0.0f);
        try {
          if (which == 0) c.reduce(tensor(in.data(), 6), tensor(out.data(), 6), c.rank() == 2);
          if (which == 1)
            c.gather(tensor(in.data(), c.rank() == 1 ? 5 : 6),
                     tensor(out.data(), c.rank() == 1 ? 15 : 18), 0);
          if (which == 2)
            c.alltoall(tensor(in.data(), c.rank() == 0 ? 3 : 6),
                       tensor(out.data(), c.rank() == 0 ? 3 : 6));
          ADD_FAILURE() << "op " << which << " returned on rank " << c.rank();
        } catch (const Error& e) {
          codes[c.rank()] = e.code();
          what[c.rank()] = e.what();
        }
      });
      for (int r = 0; r < 3; ++r) {
        EXPECT_EQ(codes[r], ErrorCode::kMismatch)
            << "op " << which << " rank " << r << ": " << what[r];
      }
    }
  }
}

TEST(RootedErrors, BadArgumentsNameTheOpAndFailEveryRank) {
  auto w = worldOn(Path::kNetwork, 2);
  std::vector<std::string> what(2);
  testing::forEachRank(w, [&](Communicator& c) {
    std::vector<float> in(8), out(4);
    try {
      if (c.rank() == 1) {
        c.scatter(Tensor{}, tensor(out.data(), 4), 2);  // root outside the world
      } else {
        c.scatter(tensor(in.data(), 8), tensor(out.data(), 4), 0);
      }
    } catch (const Error& e) {
      what[c.rank()] = e.what();
      if (c.rank() == 1) {
        EXPECT_EQ(e.code(), ErrorCode::kInvalidArgument);
      }
    }
  });
  EXPECT_NE(what[1].find("scatter"), std::string::npos) << what[1];
  EXPECT_NE(what[1].find("root 2"), std::string::npos) << what[1];
  EXPECT_FALSE(what[0].empty()) << "rank 0 must not wait for rank 1";
}

TEST(RootedErrors, AlltoallCountNotAMultipleOfTheWorld) {
  testing::runRanksCollect(3, [](Communicator& c) {
    std::vector<float> in(4), out(4);
    try {
      c.alltoall(tensor(in.data(), 4), tensor(out.data(), 4));
      ADD_FAILURE() << "accepted";
    } catch (const Error& e) {
      EXPECT_EQ(e.code(), ErrorCode::kInvalidArgument);
      EXPECT_NE(std::string(e.what()).find("multiple of the world size"), std::string::npos);
    }
  });
}

}  // namespace
}  // namespace gflow
