// The error model with ranks as threads: mismatches, invalid arguments,
// timeouts and abort() all raise gflow::Error on every rank, never hang, and
// leave the communicator failed with the original error.
#include <gtest/gtest.h>

#include <thread>

#include "core/frontend.h"
#include "gflow/gflow.h"
#include "testing/ranks.h"

namespace gflow {
namespace {

using std::chrono::milliseconds;

using testing::Outcome;

std::vector<Outcome> outcomes(int n, const std::function<void(Communicator&)>& fn,
                              Options o = Options{}) {
  return testing::runRanksOutcomes(n, fn, o);
}

TEST(Mismatch, DifferentCountsRaiseMismatchOnEveryRank) {
  for (const char* algo : {"ring", "rd", "hd"}) {
    Options o;
    o.algorithm = algo;
    auto res = outcomes(
        3,
        [](Communicator& c) {
          std::vector<float> v(c.rank() == 1 ? 11 : 10, 1.0f);
          c.allreduce(tensor(v.data(), v.size()));
        },
        o);
    for (int r = 0; r < 3; ++r) {
      ASSERT_TRUE(res[r].threw) << algo << " rank " << r;
      EXPECT_EQ(res[r].code, ErrorCode::kMismatch) << algo << " rank " << r << ": " << res[r].what;
      EXPECT_NE(res[r].what.find("count=1"), std::string::npos) << res[r].what;
    }
  }
}

TEST(Mismatch, DifferentCollectivesRaiseMismatchOnEveryRank) {
  auto res = outcomes(4, [](Communicator& c) {
    std::vector<float> v(64, 1.0f);
    if (c.rank() == 2) {
      c.broadcast(tensor(v.data(), v.size()), 0);
    } else {
      c.allreduce(tensor(v.data(), v.size()));
    }
    c.barrier();  // a rank whose own call completed learns at the next call
  });
  for (int r = 0; r < 4; ++r) {
    ASSERT_TRUE(res[r].threw) << "rank " << r;
    EXPECT_EQ(res[r].code, ErrorCode::kMismatch) << "rank " << r << ": " << res[r].what;
    EXPECT_NE(res[r].what.find("broadcast"), std::string::npos) << res[r].what;
  }
}

TEST(Mismatch, DifferentDtypesAndOps) {
  auto res = outcomes(2, [](Communicator& c) {
    std::vector<int32_t> v(8, 1);
    c.allreduce(tensor(v.data(), v.size()), c.rank() == 0 ? ReduceOp::kSum : ReduceOp::kMax);
  });
  for (int r = 0; r < 2; ++r) {
    EXPECT_EQ(res[r].code, ErrorCode::kMismatch) << res[r].what;
    EXPECT_NE(res[r].what.find("max"), std::string::npos) << res[r].what;
  }
}

TEST(InvalidArgument, BadInputOnOneRankFailsFastEverywhere) {
  auto res = outcomes(3, [](Communicator& c) {
    std::vector<float> v(16, 1.0f);
    if (c.rank() == 1) {
      c.allreduce(Tensor(nullptr, 16, DataType::kFloat32));
    } else {
      c.allreduce(tensor(v.data(), v.size()));
    }
  });
  EXPECT_EQ(res[1].code, ErrorCode::kInvalidArgument);
  EXPECT_NE(res[1].what.find("null"), std::string::npos) << res[1].what;
  EXPECT_NE(res[1].what.find("rank 1"), std::string::npos) << res[1].what;
  // The call is rejected: the others, running it, raise mismatch naming it.
  for (int r : {0, 2}) {
    ASSERT_TRUE(res[r].threw);
    EXPECT_EQ(res[r].code, ErrorCode::kMismatch) << res[r].what;
    EXPECT_NE(res[r].what.find("rank 1 rejected"), std::string::npos) << res[r].what;
    EXPECT_NE(res[r].what.find("null"), std::string::npos) << res[r].what;
  }
}

TEST(InvalidArgument, EachCheckNamesTheProblem) {
  struct Case {
    const char* needle;
    std::function<void(Communicator&, std::vector<float>&)> call;
  };
  std::vector<Case> cases = {
      {"must match",
       [](Communicator& c, std::vector<float>& v) {
         c.allreduce(tensor(v.data(), 4), tensor(v.data() + 4, 3));
       }},
      {"overlap",
       [](Communicator& c, std::vector<float>& v) {
         c.allreduce(tensor(v.data(), 4), tensor(v.data() + 2, 4));
       }},
      {"root 5",
       [](Communicator& c, std::vector<float>& v) { c.broadcast(tensor(v.data(), 4), 5); }},
      {"world size",
       [](Communicator& c, std::vector<float>& v) {
         c.reduceScatter(tensor(v.data(), 5), tensor(v.data() + 8, 2));
       }},
      {"cuda",
       [](Communicator& c, std::vector<float>& v) {
         c.allreduce(Tensor(v.data(), 4, DataType::kFloat32, Device{DeviceType::kCUDA, 0}));
       }},
      {"invalid reduce op",
       [](Communicator& c, std::vector<float>& v) {
         c.allreduce(tensor(v.data(), 4), static_cast<ReduceOp>(42));
       }},
      {"reduce op bxor does not apply to float32 data (bitwise ops take integer types",
       [](Communicator& c, std::vector<float>& v) {
         c.allreduce(tensor(v.data(), 4), ReduceOp::kBxor);
       }},
      {"reduce op max does not apply to complex64 data (complex types take sum and avg)",
       [](Communicator& c, std::vector<float>& v) {
         c.reduceScatter(Tensor(v.data(), 4, DataType::kComplex64),
                         Tensor(v.data() + 8, 2, DataType::kComplex64), ReduceOp::kMax);
       }},
      {"reduce op avg does not apply to bool data",
       [](Communicator& c, std::vector<float>& v) {
         c.reduce(Tensor(v.data(), 4, DataType::kBool), 0, ReduceOp::kAvg);
       }},
  };
  for (const Case& k : cases) {
    auto res = outcomes(2, [&](Communicator& c) {
      std::vector<float> v(16, 1.0f);
      k.call(c, v);
    });
    for (int r = 0; r < 2; ++r) {
      ASSERT_TRUE(res[r].threw);
      // Both ranks made the same mistake: whichever is told first by the other
      // may see peer_lost, but at least its own check names the problem.
      if (res[r].code == ErrorCode::kInvalidArgument) {
        EXPECT_NE(res[r].what.find(k.needle), std::string::npos) << res[r].what;
      } else {
        EXPECT_EQ(res[r].code, ErrorCode::kPeerLost) << res[r].what;
      }
    }
  }
}

TEST(Timeout, SilentPeerGivesTimeoutNamingIt) {
  Options o;
  o.timeout = milliseconds(500);
  auto start = std::chrono::steady_clock::now();
  auto res = outcomes(
      2,
      [](Communicator& c) {
        std::vector<float> v(100, 1.0f);
        if (c.rank() == 1) {
          std::this_thread::sleep_for(milliseconds(1500));
        }
        c.allreduce(tensor(v.data(), v.size()));
        // Rank 1's allreduce may still succeed (rank 0's data was already on
        // the wire); its next call must then learn that rank 0 failed.
        c.barrier();
      },
      o);
  EXPECT_LT(std::chrono::steady_clock::now() - start, std::chrono::seconds(10));
  ASSERT_TRUE(res[0].threw);
  EXPECT_EQ(res[0].code, ErrorCode::kTimeout) << res[0].what;
  EXPECT_EQ(res[0].peer, 1) << res[0].what;
  // The late rank is told by rank 0 instead of waiting for its own timeout.
  EXPECT_LT(std::chrono::steady_clock::now() - start, std::chrono::milliseconds(1500 + 1500));
  ASSERT_TRUE(res[1].threw);
  EXPECT_NE(res[1].what.find("rank 0"), std::string::npos) << res[1].what;
}

TEST(Abort, FromAnotherThreadWakesWaiterAndFailsLaterCalls) {
  auto res = outcomes(2, [](Communicator& c) {
    std::vector<float> v(100, 1.0f);
    if (c.rank() == 0) {
      std::thread watchdog([&] {
        std::this_thread::sleep_for(milliseconds(200));
        c.abort();
      });
      try {
        c.allreduce(tensor(v.data(), v.size()));  // rank 1 never joins in time
      } catch (const Error& e) {
        watchdog.join();
        EXPECT_EQ(e.code(), ErrorCode::kAborted) << e.what();
        // Later calls raise the original error.
        try {
          c.barrier();
          ADD_FAILURE() << "barrier after abort succeeded";
        } catch (const Error& e2) {
          EXPECT_EQ(e2.code(), ErrorCode::kAborted);
        }
        throw;
      }
      watchdog.join();
    } else {
      std::this_thread::sleep_for(milliseconds(600));
      // Rank 0's data may already be on the wire, so this call can succeed;
      // the next one must raise.
      c.allreduce(tensor(v.data(), v.size()));
      c.barrier();
    }
  });
  EXPECT_EQ(res[0].code, ErrorCode::kAborted);
  ASSERT_TRUE(res[1].threw);
  EXPECT_EQ(res[1].code, ErrorCode::kPeerLost) << res[1].what;
  EXPECT_NE(res[1].what.find("abort"), std::string::npos) << res[1].what;
}

TEST(Abort, PendingAsyncWorkFailsWithTheError) {
  auto res = outcomes(2, [](Communicator& c) {
    std::vector<float> v(100, 1.0f);
    if (c.rank() == 0) {
      Work w = c.allreduceAsync(tensor(v.data(), v.size()));
      Work w2 = c.allreduceAsync(tensor(v.data(), v.size()));
      std::this_thread::sleep_for(milliseconds(100));
      c.abort();
      EXPECT_THROW(w.wait(), Error);
      EXPECT_THROW(w2.wait(), Error);
      throw Error(ErrorCode::kAborted, "done");
    }
    std::this_thread::sleep_for(milliseconds(300));
    c.allreduce(tensor(v.data(), v.size()));
    c.allreduce(tensor(v.data(), v.size()));
    c.barrier();
  });
  EXPECT_TRUE(res[1].threw);
}

}  // namespace
}  // namespace gflow

namespace gflow {
namespace {

TEST(FrontEndChecks, ARejectedCallReachesThePeersAtOnce) {
  const auto t0 = std::chrono::steady_clock::now();
  Options o;
  o.timeout = std::chrono::milliseconds(60000);
  auto errors = testing::runRanksCollect(
      3,
      [](Communicator& c) {
        std::vector<float> v(16, 1.0f);
        if (c.rank() == 1) {
          frontend::rejectInvalidArgument(c, "allreduce", "x is a read-only array");
        }
        c.allreduce(tensor(v.data(), v.size()));
      },
      o);
  EXPECT_LT(std::chrono::steady_clock::now() - t0, std::chrono::seconds(20));
  for (int r = 0; r < 3; ++r) {
    ASSERT_TRUE(errors[r]) << r;
    try {
      std::rethrow_exception(errors[r]);
    } catch (const Error& e) {
      EXPECT_EQ(e.code(), r == 1 ? ErrorCode::kInvalidArgument : ErrorCode::kMismatch) << e.what();
      EXPECT_NE(std::string(e.what()).find("x is a read-only array"), std::string::npos)
          << e.what();
    }
  }
}

}  // namespace
}  // namespace gflow
