// Failures of the host backend driven directly: a peer that never calls the
// op, abort() from another thread, and ranks that call different ops. Each
// must end in a gflow::Error that names the op's sequence number, this rank
// and the peer; no hang, no crash.
#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include <ostream>
#include <string>
#include <thread>
#include <vector>

#include "backend/backend.h"
#include "backend/loopback.h"

namespace gflow {
namespace {

using backend::Algorithm;
using backend::Backend;
using backend::Op;
using backend::OpDesc;
using backend::OpKind;
using testing::BackendWorld;
using testing::errorOf;
using ::testing::HasSubstr;

// A short context timeout keeps the transport's liveness probe after a
// missed deadline short too (its grace is a quarter of it).
constexpr std::chrono::milliseconds kContextTimeout{1000};
constexpr std::chrono::milliseconds kDeadline{150};

struct SilentPeerCase {
  const char* name;
  OpKind kind;
  Algorithm algo;
  int root = 1;  // where rank 0 only sends to the silent rank 1, 0: it must receive
};
void PrintTo(const SilentPeerCase& c, std::ostream* os) {
  *os << c.name;
}

// Runs `op` (float32) on every rank but `silent` and returns what each rank
// raised.
std::vector<std::exception_ptr> runWithoutRank(BackendWorld& w, const Op& op, int silent) {
  const OpDesc& d = op.desc;
  const size_t elems = d.count * w.size();  // enough for every kind
  std::vector<std::vector<float>> in(w.size(), std::vector<float>(elems, 1.0f));
  std::vector<std::vector<float>> out(w.size(), std::vector<float>(elems));
  return w.runCollect(
      [&](int r, Backend& b) {
        if (r == silent) return;
        switch (d.kind) {
          case OpKind::kAllreduce: b.allreduce(op, in[r].data(), out[r].data()); break;
          case OpKind::kReduceScatter: b.reduceScatter(op, in[r].data(), out[r].data()); break;
          case OpKind::kAllgather: b.allgather(op, in[r].data(), out[r].data()); break;
          case OpKind::kBroadcast: b.broadcast(op, out[r].data()); break;
          case OpKind::kBarrier: b.barrier(op); break;
          case OpKind::kReduce: b.reduce(op, in[r].data(), out[r].data()); break;
          case OpKind::kGather: b.gather(op, in[r].data(), out[r].data()); break;
          case OpKind::kScatter: b.scatter(op, in[r].data(), out[r].data()); break;
          case OpKind::kAlltoall: b.alltoall(op, in[r].data(), out[r].data()); break;
          case OpKind::kAlltoallv:
          case OpKind::kAllgatherv:
            b.alltoallv(op, in[r].data(), backend::Blocks::equal(w.size(), d.count), out[r].data(),
                        backend::Blocks::equal(w.size(), d.count));
            break;
          case OpKind::kGatherv:
            b.gatherv(op, in[r].data(), out[r].data(), backend::Blocks::equal(w.size(), d.count));
            break;
          case OpKind::kScatterv:
            b.scatterv(op, in[r].data(), backend::Blocks::equal(w.size(), d.count), out[r].data());
            break;
          case OpKind::kPointToPoint: {
            // A send to the next rank and a receive from the previous one.
            const int n = w.size();
            std::vector<backend::P2PMessage> m{
                {true, (r + 1) % n, 0, DataType::kFloat32, d.count, in[r].data(), -1},
                {false, (r + n - 1) % n, 0, DataType::kFloat32, d.count, out[r].data(), -1}};
            b.startPointToPoint(op, m)->wait();
            break;
          }
        }
      },
      /*abortOthers=*/false);
}

class HostBackendSilentPeer : public ::testing::TestWithParam<SilentPeerCase> {};

// Two ranks, rank 1 never calls: rank 0's wait passes the deadline and the
// probe finds rank 1 unresponsive.
TEST_P(HostBackendSilentPeer, DeadlineRaisesTimeoutNamingThePeer) {
  BackendWorld w = BackendWorld::host(2, kContextTimeout);
  OpDesc d;
  d.kind = GetParam().kind;
  d.route = GetParam().algo;
  d.count = 64;
  d.root = GetParam().root;  // a broadcast from rank 0 could finish into the socket buffer
  const Op op = w.op(d, kDeadline);
  auto errors = runWithoutRank(w, op, 1);
  const Error e = errorOf(errors[0]);
  EXPECT_EQ(e.code(), ErrorCode::kTimeout) << e.what();
  EXPECT_EQ(e.rank(), 0);
  EXPECT_EQ(e.peer(), 1);
  EXPECT_EQ(e.seq(), op.seq);
  EXPECT_THAT(e.detail(), HasSubstr("rank 1 is not responding"));
  // The failure is sticky: the next op raises it at once.
  const Op next = w.op(d);
  std::vector<float> buf(64 * 2);
  try {
    w.at(0).allreduce(next, buf.data(), buf.data());
    ADD_FAILURE() << "an op on a failed context succeeded";
  } catch (const Error& again) {
    EXPECT_EQ(again.code(), ErrorCode::kTimeout) << again.what();
  }
}

INSTANTIATE_TEST_SUITE_P(
    Ops, HostBackendSilentPeer,
    ::testing::Values(SilentPeerCase{"RingAllreduce", OpKind::kAllreduce, Algorithm::kRing},
                      SilentPeerCase{"RecursiveDoublingAllreduce", OpKind::kAllreduce,
                                     Algorithm::kRecursiveDoubling},
                      SilentPeerCase{"ReduceScatter", OpKind::kReduceScatter, Algorithm::kRing},
                      SilentPeerCase{"Allgather", OpKind::kAllgather, Algorithm::kRing},
                      SilentPeerCase{"Broadcast", OpKind::kBroadcast, Algorithm::kChain},
                      SilentPeerCase{"ReduceBinomial", OpKind::kReduce, Algorithm::kBinomial, 0},
                      SilentPeerCase{"ReduceChain", OpKind::kReduce, Algorithm::kChain, 0},
                      SilentPeerCase{"GatherBinomial", OpKind::kGather, Algorithm::kBinomial, 0},
                      SilentPeerCase{"GatherLinear", OpKind::kGather, Algorithm::kLinear, 0},
                      SilentPeerCase{"ScatterBinomial", OpKind::kScatter, Algorithm::kBinomial},
                      SilentPeerCase{"ScatterLinear", OpKind::kScatter, Algorithm::kLinear},
                      SilentPeerCase{"Alltoall", OpKind::kAlltoall, Algorithm::kPairwise},
                      SilentPeerCase{"Alltoallv", OpKind::kAlltoallv, Algorithm::kPairwise},
                      SilentPeerCase{"Gatherv", OpKind::kGatherv, Algorithm::kLinear, 0},
                      SilentPeerCase{"Scatterv", OpKind::kScatterv, Algorithm::kLinear},
                      SilentPeerCase{"PointToPoint", OpKind::kPointToPoint, Algorithm::kDirect},
                      SilentPeerCase{"Barrier", OpKind::kBarrier, Algorithm::kDissemination}),
    [](const ::testing::TestParamInfo<SilentPeerCase>& p) { return p.param.name; });

// Three ranks in a ring, rank 2 never calls: rank 0 (which receives from
// rank 2) blames it; rank 1 times out too.
TEST(HostBackendErrors, RingTimeoutBlamesTheSilentNeighbour) {
  BackendWorld w = BackendWorld::host(3, kContextTimeout);
  OpDesc d;
  d.kind = OpKind::kAllreduce;
  d.route = Algorithm::kRing;
  d.count = 3000;
  const Op op = w.op(d, kDeadline);
  auto errors = runWithoutRank(w, op, 2);
  const Error e0 = errorOf(errors[0]);
  EXPECT_EQ(e0.code(), ErrorCode::kTimeout) << e0.what();
  EXPECT_EQ(e0.peer(), 2) << e0.what();
  EXPECT_EQ(errorOf(errors[1]).code(), ErrorCode::kTimeout) << errorOf(errors[1]).what();
  EXPECT_FALSE(errors[2]);
}

// abort() from another thread ends a wait that would otherwise last until
// the deadline, with the given error.
TEST(HostBackendErrors, AbortFromAnotherThreadEndsTheWait) {
  BackendWorld w = BackendWorld::host(2, kContextTimeout);
  OpDesc d;
  d.count = 1000;
  const Op op = w.op(d, std::chrono::milliseconds(60000));
  std::vector<float> buf(d.count, 1.0f);
  std::exception_ptr raised;
  std::thread rank0([&] {
    try {
      w.at(0).allreduce(op, buf.data(), buf.data());
    } catch (...) {
      raised = std::current_exception();
    }
  });
  w.at(0).abort(Error(ErrorCode::kAborted, "stopped by the test", ErrorContext().withRank(0)));
  rank0.join();
  const Error e = errorOf(raised);
  EXPECT_EQ(e.code(), ErrorCode::kAborted) << e.what();
  EXPECT_THAT(e.detail(), HasSubstr("stopped by the test"));
}

// Ranks that run the same op number with different counts fail with
// kMismatch naming each other (the envelope travels with every message).
TEST(HostBackendErrors, DifferentCountsRaiseMismatchNamingThePeer) {
  BackendWorld w = BackendWorld::host(2, kContextTimeout);
  OpDesc d;
  d.count = 16;
  const Op op0 = w.op(d, std::chrono::milliseconds(10000));
  Op op1 = op0;
  op1.desc.count = 17;
  std::vector<std::vector<float>> buf(2, std::vector<float>(17, 1.0f));
  auto errors = w.runCollect(
      [&](int r, Backend& b) { b.allreduce(r == 0 ? op0 : op1, buf[r].data(), buf[r].data()); },
      /*abortOthers=*/false);
  for (int r = 0; r < 2; ++r) {
    const Error e = errorOf(errors[r]);
    EXPECT_EQ(e.code(), ErrorCode::kMismatch) << "rank " << r << ": " << e.what();
    EXPECT_EQ(e.peer(), 1 - r) << e.what();
    EXPECT_THAT(e.detail(), HasSubstr("count=17"));
    EXPECT_THAT(e.detail(), HasSubstr("count=16"));
  }
}

}  // namespace
}  // namespace gflow
