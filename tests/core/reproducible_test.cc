// Reproducible mode (Options::reproducible, AllreduceOptions::reproducible,
// ReducerOptions::reproducible): the bits of an allreduce or reduce-scatter
// are those of the fixed-order reference computed here, element by element
// by the fixed tree (testing/fixed_tree.h; for four ranks (x0 + x1) +
// (x2 + x3)) in float32 for float16/bfloat16 and in the element type for
// float32/float64, whatever cuts the work: one tensor or many
// buckets of random sizes, the algorithm the default mode would pick, one or
// two hosts, shared memory or not, the piece size and the sockets per peer.
// The same layouts in the default mode must differ from the reference in at
// least one case, which shows that these tests can fail.
#include <gtest/gtest.h>

#include <atomic>
#include <cmath>
#include <cstring>
#include <optional>
#include <random>
#include <string>
#include <tuple>
#include <vector>

#include "gflow/gflow.h"
#include "gflow/reducer.h"
#include "kernels/reduce.h"
#include "testing/fixed_tree.h"
#include "testing/ranks.h"
#include "testing/soft_verbs.h"

namespace gflow {
namespace {

constexpr int kRanks = 4;

// float32 rounded once to a 16- or 8-bit float type (stored at p).
void storeNarrow(DataType t, float f, char* p) {
  if (t == DataType::kFloat8E4M3 || t == DataType::kFloat8E5M2) {
    const uint8_t b =
        t == DataType::kFloat8E4M3 ? kernels::floatToFloat8e4m3(f) : kernels::floatToFloat8e5m2(f);
    std::memcpy(p, &b, 1);
    return;
  }
  const uint16_t h =
      t == DataType::kFloat16 ? kernels::floatToHalf(f) : kernels::floatToBfloat16(f);
  std::memcpy(p, &h, 2);
}

// Random values of `dtype` with a wide spread of magnitudes, so the order of
// a sum changes its rounding (float8: within E4M3's range).
std::vector<char> inputs(DataType dtype, int rank, size_t n) {
  std::mt19937 rng(static_cast<uint32_t>(7 + 131 * rank + static_cast<int>(dtype)));
  std::uniform_real_distribution<double> mant(-1.0, 1.0);
  const bool f8 = dtype == DataType::kFloat8E4M3 || dtype == DataType::kFloat8E5M2;
  std::uniform_int_distribution<int> expo(f8 ? -5 : -12, f8 ? 5 : 12);
  std::vector<char> v(n * dataTypeSize(dtype));
  for (size_t i = 0; i < n; ++i) {
    const double x = std::ldexp(mant(rng), expo(rng));
    char* p = v.data() + i * dataTypeSize(dtype);
    if (dtype == DataType::kFloat64) {
      std::memcpy(p, &x, 8);
    } else if (dtype == DataType::kFloat32) {
      const float f = static_cast<float>(x);
      std::memcpy(p, &f, 4);
    } else {
      storeNarrow(dtype, static_cast<float>(x), p);
    }
  }
  return v;
}

double load(DataType t, const char* p) {
  if (t == DataType::kFloat64) {
    double d;
    std::memcpy(&d, p, 8);
    return d;
  }
  if (t == DataType::kFloat32) {
    float f;
    std::memcpy(&f, p, 4);
    return f;
  }
  if (t == DataType::kFloat8E4M3 || t == DataType::kFloat8E5M2) {
    const auto b = static_cast<uint8_t>(*p);
    return t == DataType::kFloat8E4M3 ? kernels::float8e4m3ToFloat(b)
                                      : kernels::float8e5m2ToFloat(b);
  }
  uint16_t h;
  std::memcpy(&h, p, 2);
  return t == DataType::kFloat16 ? kernels::halfToFloat(h) : kernels::bfloat16ToFloat(h);
}

// The fixed-order result: the ranks' values summed by the fixed tree, in
// float64 for float64 data and float32 otherwise, divided by N once for
// avg, rounded once to the element type.
std::vector<char> reference(DataType t, ReduceOp op, size_t n, int ranks = kRanks) {
  std::vector<std::vector<char>> in;
  for (int r = 0; r < ranks; ++r) in.push_back(inputs(t, r, n));
  const size_t es = dataTypeSize(t);
  std::vector<char> out(n * es);
  for (size_t i = 0; i < n; ++i) {
    char* p = out.data() + i * es;
    if (t == DataType::kFloat64) {
      std::vector<double> x(ranks);
      for (int r = 0; r < ranks; ++r) x[r] = load(t, in[r].data() + i * es);
      double acc = testing::fixedTreeSum(x);
      if (op == ReduceOp::kAvg) acc /= ranks;
      std::memcpy(p, &acc, 8);
      continue;
    }
    std::vector<float> x(ranks);
    for (int r = 0; r < ranks; ++r) x[r] = static_cast<float>(load(t, in[r].data() + i * es));
    float acc = testing::fixedTreeSum(x);
    if (op == ReduceOp::kAvg) acc /= static_cast<float>(ranks);
    if (t == DataType::kFloat32) {
      std::memcpy(p, &acc, 4);
    } else {
      storeNarrow(t, acc, p);
    }
  }
  return out;
}

// How the work is cut and where it runs.
struct Layout {
  std::string name;
  std::string algo;  // Options::algorithm ("" = automatic)
  int hosts = 1;
  bool shm = true;
  uint64_t pieceBytes = 0;  // 0: default
  int sockets = 0;          // 0: default
  bool buckets = false;     // many ops over random slices instead of one
  uint64_t shmChunk = 0;    // 0: default
  bool verbs = false;       // the verbs transport on the software RDMA device
};

std::vector<Layout> layouts() {
  return {
      {"one_tensor_shm", "", 1, true, 0, 0, false},
      {"buckets_shm", "", 1, true, 0, 0, true},
      {"shm_small_chunks", "", 1, true, 0, 0, false, 4096},
      {"ring_tcp", "ring", 1, false, 0, 0, false},
      {"rd_tcp_buckets", "rd", 1, false, 0, 0, true},
      {"hd_tcp", "hd", 1, false, 0, 0, false},
      {"two_hosts_hier", "", 2, true, 0, 0, false},
      {"two_hosts_buckets_small_pieces", "", 2, true, 4096, 0, true},
      {"tcp_two_sockets_small_pieces", "ring", 1, false, 1024, 2, false},
      {"verbs_buckets", "", 1, false, 0, 0, true, 0, true},
  };
}

Options optionsFor(const Layout& l, bool reproducible) {
  Options o;
  o.algorithm = l.algo;
  o.shm.enabled = l.shm;
  if (l.pieceBytes) o.tuning.pieceBytes = l.pieceBytes;
  if (l.sockets) o.tcp.socketsPerPeer = l.sockets;
  if (l.shmChunk) o.shm.chunkBytes = l.shmChunk;
  if (l.verbs) o.transport = "verbs";
  o.reproducible = reproducible;
  return o;
}

// Random cut points of [0, n), the same on every rank.
std::vector<size_t> cuts(size_t n) {
  std::mt19937 rng(99);
  std::uniform_int_distribution<size_t> len(1, n / 5);
  std::vector<size_t> at = {0};
  while (at.back() < n) at.push_back(std::min(n, at.back() + len(rng)));
  return at;
}

// A world of `ranks` under layout `l` (with the software RDMA device while
// it lives, for verbs).
struct LayoutWorld {
  LayoutWorld(const Layout& l, bool reproducible, int ranks = kRanks) {
    std::vector<int> hostOf(ranks);
    for (int r = 0; r < ranks; ++r) hostOf[r] = r * l.hosts / ranks;
    if (l.verbs) device.emplace();
    comms = testing::makeWorldWith(ranks, testing::onHosts(hostOf, optionsFor(l, reproducible)));
  }
  std::optional<testing::softverbs::Installed> device;  // outlives comms
  std::vector<std::shared_ptr<Communicator>> comms;
};

// Every rank's allreduce result of `t` under layout `l`.
std::vector<std::vector<char>> run(const Layout& l, bool reproducible, DataType t, ReduceOp op,
                                   size_t n, int ranks) {
  std::vector<std::vector<char>> got(ranks);
  LayoutWorld world(l, reproducible, ranks);
  const size_t es = dataTypeSize(t);
  testing::forEachRank(world.comms, [&](Communicator& c) {
    std::vector<char> v = inputs(t, c.rank(), n);
    if (!l.buckets) {
      c.allreduce(Tensor(v.data(), n, t), op);
    } else {
      const std::vector<size_t> at = cuts(n);
      for (size_t k = 0; k + 1 < at.size(); ++k) {
        c.allreduce(Tensor(v.data() + at[k] * es, at[k + 1] - at[k], t), op);
      }
    }
    got[c.rank()] = std::move(v);
  });
  return got;
}

// The dtype and the world size (3, 5: avg divides inexactly; 2, 4, 8:
// halving-doubling over the network; 3, 5: the owner-computes exchange).
using DtypeRanks = std::tuple<DataType, int>;
class Reproducible : public ::testing::TestWithParam<DtypeRanks> {};

TEST_P(Reproducible, EveryLayoutGivesTheFixedOrderBits) {
  const auto [t, ranks] = GetParam();
  const size_t n = 30011;  // uneven blocks, several rounds with small pieces
  for (ReduceOp op : {ReduceOp::kSum, ReduceOp::kAvg}) {
    const std::vector<char> want = reference(t, op, n, ranks);
    bool defaultDiffers = false;
    for (const Layout& l : layouts()) {
      const auto got = run(l, true, t, op, n, ranks);
      for (int r = 0; r < ranks; ++r) {
        ASSERT_EQ(got[r].size(), want.size());
        EXPECT_EQ(std::memcmp(got[r].data(), want.data(), want.size()), 0)
            << l.name << " " << toString(op) << ": rank " << r << " differs from the fixed order";
      }
      const auto plain = run(l, false, t, op, n, ranks);
      if (std::memcmp(plain[0].data(), want.data(), want.size()) != 0) defaultDiffers = true;
    }
    // The test can fail: the default mode's sums differ somewhere (two
    // operands have only one sum).
    if (ranks > 2) {
      EXPECT_TRUE(defaultDiffers) << toString(op) << ": no layout of the default mode differs";
    }
  }
}

INSTANTIATE_TEST_SUITE_P(
    Dtypes, Reproducible,
    ::testing::Values(DtypeRanks{DataType::kFloat32, 4}, DtypeRanks{DataType::kFloat16, 4},
                      DtypeRanks{DataType::kBFloat16, 4}, DtypeRanks{DataType::kFloat64, 4},
                      DtypeRanks{DataType::kFloat8E4M3, 4}, DtypeRanks{DataType::kFloat8E5M2, 4},
                      DtypeRanks{DataType::kFloat32, 3}, DtypeRanks{DataType::kFloat16, 3},
                      DtypeRanks{DataType::kFloat32, 2}, DtypeRanks{DataType::kBFloat16, 2},
                      DtypeRanks{DataType::kFloat32, 5}, DtypeRanks{DataType::kFloat16, 8}),
    [](const ::testing::TestParamInfo<DtypeRanks>& i) {
      return std::string(toString(std::get<0>(i.param))) + "_n" +
             std::to_string(std::get<1>(i.param));
    });

// Reduce-scatter: rank r's block is block r of the fixed-order reference,
// on shared memory, over TCP and across two hosts.
TEST(ReproducibleReduceScatter, EveryLayoutGivesTheFixedOrderBlock) {
  const DataType t = DataType::kFloat32;
  const size_t per = 7001;
  const std::vector<char> want = reference(t, ReduceOp::kSum, per * kRanks);
  std::atomic<bool> defaultDiffers{false};
  for (const Layout& l : layouts()) {
    for (bool reproducible : {true, false}) {
      LayoutWorld world(l, reproducible);
      testing::forEachRank(world.comms, [&](Communicator& c) {
        std::vector<char> in = inputs(t, c.rank(), per * kRanks);
        std::vector<float> out(per);
        c.reduceScatter(Tensor(in.data(), per * kRanks, t), tensor(out.data(), per));
        const bool same = std::memcmp(out.data(), want.data() + c.rank() * per * 4, per * 4) == 0;
        if (reproducible) {
          EXPECT_TRUE(same) << l.name << ": rank " << c.rank();
        } else if (!same) {
          defaultDiffers = true;
        }
      });
    }
  }
  EXPECT_TRUE(defaultDiffers) << "no layout of the default reduce-scatter differs";
}

// AllreduceOptions::reproducible on a communicator in the default mode
// (compressed or not): the same bits over shared memory and over TCP; the
// uncompressed one is the reference's.
TEST(ReproducibleOption, PerOpOnADefaultCommunicator) {
  const size_t n = 20011;
  const std::vector<char> want = reference(DataType::kFloat32, ReduceOp::kSum, n);
  for (DataType wire : {DataType::kFloat32, DataType::kBFloat16}) {
    std::vector<std::vector<char>> first;
    for (bool shm : {true, false}) {
      Options base;
      base.shm.enabled = shm;
      std::vector<std::vector<char>> got(kRanks);
      testing::runRanks(
          kRanks,
          [&](Communicator& c) {
            std::vector<char> v = inputs(DataType::kFloat32, c.rank(), n);
            AllreduceOptions o;
            o.wire = wire;
            o.reproducible = true;
            c.allreduce(Tensor(v.data(), n, DataType::kFloat32), o);
            got[c.rank()] = std::move(v);
          },
          base);
      for (int r = 0; r < kRanks; ++r) {
        if (wire == DataType::kFloat32) {
          EXPECT_EQ(std::memcmp(got[r].data(), want.data(), want.size()), 0) << "rank " << r;
        }
        if (!first.empty()) {
          EXPECT_EQ(got[r], first[r]) << toString(wire) << " rank " << r << ": shm vs tcp";
        }
      }
      if (first.empty()) first = got;
    }
  }
}

// Ranks that disagree about reproducible mode for one op all raise
// kMismatch, and the communicator is not left hanging.
TEST(ReproducibleOption, RanksThatDisagreeRaiseMismatch) {
  for (bool shm : {true, false}) {
    Options base;
    base.shm.enabled = shm;
    const auto outcomes = testing::runRanksOutcomes(
        kRanks,
        [](Communicator& c) {
          std::vector<float> v(4096, 1.0f);
          AllreduceOptions o;
          o.reproducible = c.rank() == 1;
          c.allreduce(tensor(v.data(), v.size()), o);
        },
        base);
    for (int r = 0; r < kRanks; ++r) {
      EXPECT_TRUE(outcomes[r].threw) << "shm=" << shm << " rank " << r;
      EXPECT_EQ(outcomes[r].code, ErrorCode::kMismatch)
          << "shm=" << shm << " rank " << r << ": " << outcomes[r].what;
    }
  }
}

// Shared memory reads its members' buffers directly (single copy) or goes
// through the slots: both give the fixed order's bits, for 2 and 3 ranks,
// in place and out of place, float32 and bfloat16.
TEST(ReproducibleShm, SingleCopyAndSlotsGiveTheFixedOrderBits) {
  const size_t n = 100003;  // 400 KB of float32: several single-copy chunks
  for (int ranks : {2, 3}) {
    for (DataType t : {DataType::kFloat32, DataType::kBFloat16}) {
      const std::vector<char> want = reference(t, ReduceOp::kAvg, n, ranks);
      for (const char* range : {"4K-", "off"}) {
        Options o;
        o.reproducible = true;
        o.shm.singleCopy = range;
        testing::runRanks(
            ranks,
            [&](Communicator& c) {
              std::vector<char> in = inputs(t, c.rank(), n), out(in.size());
              c.allreduce(Tensor(in.data(), n, t), Tensor(out.data(), n, t), ReduceOp::kAvg);
              c.allreduce(Tensor(in.data(), n, t), ReduceOp::kAvg);
              EXPECT_EQ(out, want) << ranks << " ranks " << toString(t) << " " << range
                                   << " out of place, rank " << c.rank();
              EXPECT_EQ(in, want) << ranks << " ranks " << toString(t) << " " << range
                                  << " in place, rank " << c.rank();
            },
            o);
      }
    }
  }
}

// Across two hosts a rank that asks for reproducible mode runs the flat
// fixed order while the others run the hierarchical composition, whose
// phases have their own channels: no message compares the two, so the
// disagreement ends at the deadline (a timeout or the peers' reports), on
// every rank, not in a hang and not in wrong data.
TEST(ReproducibleOption, RanksThatDisagreeAcrossHostsFailByTheDeadline) {
  Options base;
  base.timeout = std::chrono::seconds(2);
  auto world = testing::makeWorldWith(kRanks, testing::onHosts({0, 0, 1, 1}, base));
  std::vector<std::string> errors(kRanks);
  const auto start = std::chrono::steady_clock::now();
  testing::forEachRank(world, [&](Communicator& c) {
    std::vector<float> v(4096, 1.0f);
    AllreduceOptions o;
    o.reproducible = c.rank() == 1;
    try {
      c.allreduce(tensor(v.data(), v.size()), o);
    } catch (const Error& e) {
      errors[c.rank()] = std::string(toString(e.code())) + ": " + e.what();
    }
  });
  const double took =
      std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
  for (int r = 0; r < kRanks; ++r) EXPECT_FALSE(errors[r].empty()) << "rank " << r << " returned";
  EXPECT_LT(took, 15.0);
}

// GradientReducer: 37 gradients of random sizes, averaged with bucket
// thresholds from 1 KiB to 1 MiB, fixed buckets or negotiated rounds: in
// reproducible mode every configuration gives the bits of the fixed-order
// reference; in the default mode some configuration differs.
TEST(ReproducibleReducer, BucketingDoesNotChangeTheBits) {
  std::mt19937 rng(5);
  std::uniform_int_distribution<size_t> len(1, 9000);
  std::vector<size_t> sizes(37);
  size_t total = 0;
  for (size_t& s : sizes) total += (s = len(rng));
  const std::vector<char> want = reference(DataType::kFloat32, ReduceOp::kAvg, total);
  struct Config {
    uint64_t threshold;
    int cycleMs;
  };
  bool defaultDiffers = false;
  for (bool reproducible : {true, false}) {
    for (Config cfg :
         {Config{1024, 0}, Config{64 << 10, 0}, Config{1 << 20, 0}, Config{32 << 10, 2}}) {
      std::vector<std::vector<char>> got(kRanks);
      testing::runRanks(kRanks, [&](Communicator& c) {
        std::vector<char> flat = inputs(DataType::kFloat32, c.rank(), total);
        // Separate tensors (not one flat buffer), so small ones are packed.
        std::vector<std::vector<float>> grads;
        std::vector<Tensor> ts;
        size_t at = 0;
        for (size_t s : sizes) {
          grads.emplace_back(s);
          std::memcpy(grads.back().data(), flat.data() + at * 4, s * 4);
          at += s;
        }
        for (auto& g : grads) ts.push_back(tensor(g.data(), g.size()));
        ReducerOptions ro;
        ro.fusionThreshold = cfg.threshold;
        ro.cycleTime = std::chrono::milliseconds(cfg.cycleMs);
        ro.reproducible = reproducible;
        auto shared = std::shared_ptr<Communicator>(&c, [](Communicator*) {});
        GradientReducer reducer(shared, ts, ro);
        for (size_t i = grads.size(); i-- > 0;) reducer.ready(i);
        reducer.wait();
        at = 0;
        for (auto& g : grads) {
          std::memcpy(flat.data() + at * 4, g.data(), g.size() * 4);
          at += g.size();
        }
        got[c.rank()] = std::move(flat);
      });
      const std::string what = std::string(reproducible ? "reproducible" : "default") +
                               " threshold " + std::to_string(cfg.threshold) + " cycle " +
                               std::to_string(cfg.cycleMs);
      for (int r = 0; r < kRanks; ++r) {
        const bool same = std::memcmp(got[r].data(), want.data(), want.size()) == 0;
        if (reproducible) {
          EXPECT_TRUE(same) << what << ": rank " << r;
        } else if (!same) {
          defaultDiffers = true;
        }
      }
    }
  }
  EXPECT_TRUE(defaultDiffers) << "no bucketing of the default mode differs from the fixed order";
}

}  // namespace
}  // namespace gflow
