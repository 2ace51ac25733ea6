// A collective call rejected for its arguments (CommunicatorImpl::reject),
// with ranks as threads on every host path: when every rank rejects it, the
// communicator stays usable and later ops (blocking and async, queued before
// and after the rejection) are exact; when one rank rejects it and the
// others run it, they raise kMismatch naming the rejection at once, not at
// their deadline, whichever side comes first. A point-to-point call with bad
// arguments still fails the communicator (its peer has no op number to
// reject).
#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include <chrono>
#include <cstdint>
#include <optional>
#include <string>
#include <thread>
#include <vector>

#include "core/frontend.h"
#include "gflow/gflow.h"
#include "testing/paths.h"
#include "testing/ranks.h"

namespace gflow {
namespace {

using std::chrono::milliseconds;
using ::testing::HasSubstr;
using testing::WorldPath;

// rank r's element i, and the exact sum over `n` ranks.
int64_t valueAt(int r, size_t i) {
  return int64_t(r + 1) * int64_t(i % 7 + 1);
}
int64_t sumAt(int n, size_t i) {
  return int64_t(n) * (n + 1) / 2 * int64_t(i % 7 + 1);
}

std::vector<int64_t> rankValues(int r, size_t count) {
  std::vector<int64_t> v(count);
  for (size_t i = 0; i < count; ++i) v[i] = valueAt(r, i);
  return v;
}

void expectInvalid(const std::function<void()>& call, const char* what) {
  try {
    call();
    ADD_FAILURE() << "no error: " << what;
  } catch (const Error& e) {
    EXPECT_EQ(e.code(), ErrorCode::kInvalidArgument) << what << ": " << e.what();
  }
}

// What each rank's fn raised on `world`.
std::vector<testing::Outcome> outcomesOn(const std::vector<std::shared_ptr<Communicator>>& world,
                                         const std::function<void(Communicator&)>& fn) {
  std::vector<testing::Outcome> out(world.size());
  std::vector<std::thread> threads;
  for (size_t r = 0; r < world.size(); ++r) {
    threads.emplace_back([&, r] {
      try {
        fn(*world[r]);
      } catch (const Error& e) {
        out[r] = testing::Outcome{true, e.code(), e.what(), e.peer()};
      }
    });
  }
  for (auto& t : threads) t.join();
  return out;
}

class Rejected : public testing::OnPaths {};

// Every rank makes the same bad calls between good ones (sizes on the small
// and the large algorithms); an async allreduce is in flight across one.
TEST_P(Rejected, EveryRankRejectsAndTheCommunicatorStaysUsable) {
  const int n = this->n();
  Options o;
  o.timeout = milliseconds(30000);
  auto w = world(o);
  testing::forEachRank(w, [n](Communicator& c) {
    const int r = c.rank();
    for (size_t count : {size_t(16), size_t(300000)}) {
      std::vector<int64_t> a = rankValues(r, count), b(count + 1), out(count * n);
      expectInvalid([&] { c.allreduce(tensor(a.data(), count), tensor(b.data(), count + 1)); },
                    "allreduce with counts that differ");
      c.allreduce(tensor(a.data(), count));
      for (size_t i = 0; i < count; ++i) ASSERT_EQ(a[i], sumAt(n, i)) << "allreduce " << i;

      a = rankValues(r, count);
      Work pending = c.allreduceAsync(tensor(a.data(), count));
      expectInvalid([&] { c.broadcast(tensor(b.data(), count), n); }, "broadcast root n");
      std::vector<float> f(count, 1.0f);
      expectInvalid([&] { c.reduce(tensor(f.data(), count), 0, ReduceOp::kBxor); },
                    "bxor on float32");
      pending.wait();
      for (size_t i = 0; i < count; ++i) ASSERT_EQ(a[i], sumAt(n, i)) << "async " << i;

      std::vector<int64_t> mine = rankValues(r, count);
      expectInvalid([&] { c.alltoall(tensor(mine.data(), count), tensor(out.data(), count - 1)); },
                    "alltoall with a short output");
      c.allgather(tensor(mine.data(), count), tensor(out.data(), count * n));
      for (int p = 0; p < n; ++p) {
        for (size_t i = 0; i < count; ++i) {
          ASSERT_EQ(out[p * count + i], valueAt(p, i)) << "allgather block " << p;
        }
      }
      std::vector<int64_t> bc = rankValues(r, count);
      c.broadcast(tensor(bc.data(), count), n - 1);
      for (size_t i = 0; i < count; ++i) ASSERT_EQ(bc[i], valueAt(n - 1, i)) << "broadcast";
    }
    // A front end's own check (the Python module, the torch backend) too.
    expectInvalid([&] { frontend::rejectInvalidArgument(c, "allreduce", "a read-only array"); },
                  "front end");
    c.barrier();
  });
}

INSTANTIATE_TEST_SUITE_P(Paths, Rejected,
                         ::testing::Values(std::make_tuple(WorldPath::kShm, 3),
                                           std::make_tuple(WorldPath::kNetwork, 3),
                                           std::make_tuple(WorldPath::kTwoHosts, 4),
                                           std::make_tuple(WorldPath::kVerbs, 3)),
                         testing::pathName);

// Rank 1 rejects an allreduce the others run, before or after they are
// waiting in it: they raise kMismatch naming the rejection long before the
// deadline, and every rank's next call raises (the ranks disagreed).
class OneRejects : public ::testing::TestWithParam<std::tuple<WorldPath, bool>> {
 protected:
  void SetUp() override {
    if (std::get<0>(GetParam()) == WorldPath::kVerbs) device_.emplace();
  }

 private:
  std::optional<testing::softverbs::Installed> device_;
};

TEST_P(OneRejects, ThePeersThatRunTheOpRaiseAtOnce) {
  const WorldPath path = std::get<0>(GetParam());
  const bool peersFirst = std::get<1>(GetParam());
  const int n = path == WorldPath::kTwoHosts ? 4 : 3;
  Options o;
  o.timeout = milliseconds(120000);
  auto w = testing::worldOnPath(path, n, o);
  const auto t0 = std::chrono::steady_clock::now();
  auto res = outcomesOn(w, [&](Communicator& c) {
    std::vector<int64_t> a = rankValues(c.rank(), 4096), b(10);
    const bool rejecter = c.rank() == 1;
    if (rejecter == peersFirst) std::this_thread::sleep_for(milliseconds(300));
    if (rejecter) {
      expectInvalid([&] { c.allreduce(tensor(a.data(), a.size()), tensor(b.data(), b.size())); },
                    "allreduce with counts that differ");
    } else {
      c.allreduce(tensor(a.data(), a.size()));
    }
    c.barrier();
  });
  EXPECT_LT(std::chrono::steady_clock::now() - t0, std::chrono::seconds(60));
  for (int r = 0; r < n; ++r) {
    ASSERT_TRUE(res[r].threw) << "rank " << r;
    EXPECT_EQ(res[r].code, ErrorCode::kMismatch) << "rank " << r << ": " << res[r].what;
    if (r != 1) {
      EXPECT_THAT(res[r].what, HasSubstr("rejected")) << "rank " << r;
    }
  }
}

std::string oneRejectsName(const ::testing::TestParamInfo<std::tuple<WorldPath, bool>>& p) {
  static const char* const kNames[] = {"shm", "network", "two_hosts", "verbs"};
  return std::string(kNames[int(std::get<0>(p.param))]) +
         (std::get<1>(p.param) ? "_peers_first" : "_rejecter_first");
}

INSTANTIATE_TEST_SUITE_P(Paths, OneRejects,
                         ::testing::Combine(::testing::Values(WorldPath::kShm, WorldPath::kNetwork,
                                                              WorldPath::kTwoHosts,
                                                              WorldPath::kVerbs),
                                            ::testing::Bool()),
                         oneRejectsName);

// A send with a bad argument fails the communicator: the receiver, waiting
// on it, raises peer_lost at once.
TEST(RejectedPointToPoint, ABadSendFailsTheCommunicator) {
  Options o;
  o.timeout = milliseconds(120000);
  const auto t0 = std::chrono::steady_clock::now();
  auto res = testing::runRanksOutcomes(
      2,
      [](Communicator& c) {
        std::vector<int64_t> v(8);
        if (c.rank() == 0) {
          std::this_thread::sleep_for(milliseconds(200));
          try {
            c.send(tensor(v.data(), v.size()), 1, -1);
          } catch (const Error& e) {
            EXPECT_EQ(e.code(), ErrorCode::kInvalidArgument) << e.what();
          }
          c.barrier();  // the communicator has failed
        } else {
          c.recv(tensor(v.data(), v.size()), 0, 0);
        }
      },
      o);
  EXPECT_LT(std::chrono::steady_clock::now() - t0, std::chrono::seconds(60));
  EXPECT_EQ(res[0].code, ErrorCode::kInvalidArgument) << res[0].what;
  EXPECT_EQ(res[1].code, ErrorCode::kPeerLost) << res[1].what;
}

}  // namespace
}  // namespace gflow
