// kernels::OrderedReduction, reproducible mode's one arithmetic, against the
// tests' own fixed tree (testing/fixed_tree.h): for every world size up to
// 17, the float types and the ops that round, the bits of the result are
// the tree's in the accumulation type (float32 for float16 and bfloat16),
// divided once for avg and rounded once to the element type; operands may
// be overwritten once the next add() returns, and dst may be any operand;
// reduceAll gives add()'s bits a block at a time.
#include <gtest/gtest.h>

#include <cmath>
#include <cstring>
#include <random>
#include <string>
#include <vector>

#include "kernels/ordered_reduce.h"
#include "kernels/reduce.h"
#include "testing/fixed_tree.h"

namespace gflow::kernels {
namespace {

constexpr size_t kCount = 37;  // odd: every vector tail

// Random values of `t` spread over 2^-12 .. 2^12 (2^-3 .. 2^3 for prod),
// so that the order of a sum or product changes its rounding.
std::vector<char> operand(DataType t, ReduceOp op, int rank, size_t count = kCount) {
  std::mt19937 rng(static_cast<uint32_t>(11 + 97 * rank + 7 * static_cast<int>(t)));
  std::uniform_real_distribution<double> mant(-1.0, 1.0);
  const int e = op == ReduceOp::kProd ? 3 : 12;
  std::uniform_int_distribution<int> expo(-e, e);
  const size_t es = dataTypeSize(t);
  std::vector<char> v(count * es);
  for (size_t i = 0; i < count; ++i) {
    const double x = std::ldexp(mant(rng), expo(rng));
    char* p = v.data() + i * es;
    if (t == DataType::kFloat64) {
      std::memcpy(p, &x, 8);
    } else if (t == DataType::kFloat32) {
      const float f = static_cast<float>(x);
      std::memcpy(p, &f, 4);
    } else {
      const float f = static_cast<float>(x);
      const uint16_t h = t == DataType::kFloat16 ? floatToHalf(f) : floatToBfloat16(f);
      std::memcpy(p, &h, 2);
    }
  }
  return v;
}

float loadFloat(DataType t, const char* p) {
  if (t == DataType::kFloat32) {
    float f;
    std::memcpy(&f, p, 4);
    return f;
  }
  uint16_t h;
  std::memcpy(&h, p, 2);
  return t == DataType::kFloat16 ? halfToFloat(h) : bfloat16ToFloat(h);
}

template <typename T>
T apply(ReduceOp op, T a, T b) {
  return op == ReduceOp::kProd ? a * b : a + b;
}

// The tree in the accumulation type, divided once for avg, rounded once.
std::vector<char> reference(DataType t, ReduceOp op, const std::vector<std::vector<char>>& in) {
  const int n = static_cast<int>(in.size());
  const size_t es = dataTypeSize(t);
  std::vector<char> out(kCount * es);
  for (size_t i = 0; i < kCount; ++i) {
    char* p = out.data() + i * es;
    if (t == DataType::kFloat64) {
      std::vector<double> x(n);
      for (int r = 0; r < n; ++r) std::memcpy(&x[r], in[r].data() + i * 8, 8);
      double v = testing::fixedTree(x, [op](double a, double b) { return apply(op, a, b); });
      if (op == ReduceOp::kAvg) v /= n;
      std::memcpy(p, &v, 8);
      continue;
    }
    std::vector<float> x(n);
    for (int r = 0; r < n; ++r) x[r] = loadFloat(t, in[r].data() + i * es);
    float v = testing::fixedTree(x, [op](float a, float b) { return apply(op, a, b); });
    if (op == ReduceOp::kAvg) v /= static_cast<float>(n);
    if (t == DataType::kFloat32) {
      std::memcpy(p, &v, 4);
    } else {
      const uint16_t h = t == DataType::kFloat16 ? floatToHalf(v) : floatToBfloat16(v);
      std::memcpy(p, &h, 2);
    }
  }
  return out;
}

std::vector<std::vector<char>> operands(DataType t, ReduceOp op, int n) {
  std::vector<std::vector<char>> in;
  for (int r = 0; r < n; ++r) in.push_back(operand(t, op, r));
  return in;
}

// The first mismatching element, or -1.
long firstDifference(const std::vector<char>& a, const std::vector<char>& b, size_t es) {
  for (size_t i = 0; i < kCount; ++i) {
    if (std::memcmp(a.data() + i * es, b.data() + i * es, es) != 0) return static_cast<long>(i);
  }
  return -1;
}

const DataType kTypes[] = {DataType::kFloat32, DataType::kFloat64, DataType::kFloat16,
                           DataType::kBFloat16};
const ReduceOp kOps[] = {ReduceOp::kSum, ReduceOp::kAvg, ReduceOp::kProd};

TEST(OrderedReduction, EveryWorldSizeGivesTheFixedTreeBits) {
  for (DataType t : kTypes) {
    for (ReduceOp op : kOps) {
      for (int n = 1; n <= 17; ++n) {
        const auto in = operands(t, op, n);
        const size_t es = dataTypeSize(t);
        // Each operand in one of two buffers in turn: the buffer of operand
        // r is overwritten by operand r + 2 once add(r + 1) has returned.
        std::vector<char> bufs[2] = {std::vector<char>(kCount * es),
                                     std::vector<char>(kCount * es)};
        std::vector<char> out(kCount * es), acc(kCount * OrderedReduction::accumulatorBytes(t, n));
        OrderedReduction red(t, op, n, kCount, out.data(), acc.data());
        for (int r = 0; r < n; ++r) {
          ASSERT_EQ(red.next(), r);
          std::memcpy(bufs[r % 2].data(), in[r].data(), in[r].size());
          red.add(bufs[r % 2].data());
        }
        EXPECT_EQ(firstDifference(out, reference(t, op, in), es), -1)
            << toString(t) << " " << toString(op) << " N = " << n;
      }
    }
  }
}

TEST(OrderedReduction, TheResultMayOverwriteAnyOperand) {
  for (DataType t : kTypes) {
    for (int n : {2, 3, 4, 5, 6, 8}) {
      const auto in = operands(t, ReduceOp::kAvg, n);
      const auto want = reference(t, ReduceOp::kAvg, in);
      for (int k = 0; k < n; ++k) {
        auto data = in;
        std::vector<char> acc(kCount * OrderedReduction::accumulatorBytes(t, n));
        OrderedReduction red(t, ReduceOp::kAvg, n, kCount, data[k].data(), acc.data());
        for (int r = 0; r < n; ++r) red.add(data[r].data());
        EXPECT_EQ(firstDifference(data[k], want, dataTypeSize(t)), -1)
            << toString(t) << " N = " << n << " into operand " << k;
      }
    }
  }
}

// The reference can tell the tree from rank order: for 4 and 5 ranks some
// float32 sum of these inputs rounds differently in ((x0 + x1) + x2) + x3.
TEST(OrderedReduction, TheTreeIsNotRankOrder) {
  for (int n : {4, 5}) {
    const auto in = operands(DataType::kFloat32, ReduceOp::kSum, n);
    const auto tree = reference(DataType::kFloat32, ReduceOp::kSum, in);
    std::vector<char> sequential(tree.size());
    for (size_t i = 0; i < kCount; ++i) {
      float acc = loadFloat(DataType::kFloat32, in[0].data() + i * 4);
      for (int r = 1; r < n; ++r) acc += loadFloat(DataType::kFloat32, in[r].data() + i * 4);
      std::memcpy(sequential.data() + i * 4, &acc, 4);
    }
    EXPECT_NE(firstDifference(tree, sequential, 4), -1) << "N = " << n;
  }
}

// reduceAll: the bits of add() in rank order, over several blocks and a
// tail, into a separate buffer and over an operand.
TEST(OrderedReduction, ReduceAllGivesTheBitsOfAddBlockByBlock) {
  const size_t count = 2 * OrderedReduction::kBlock + 37;
  for (DataType t : kTypes) {
    const size_t es = dataTypeSize(t);
    for (int n : {1, 3, 4, 5, 8}) {
      std::vector<std::vector<char>> in;
      for (int r = 0; r < n; ++r) in.push_back(operand(t, ReduceOp::kAvg, r, count));
      std::vector<char> want(count * es), acc(count * OrderedReduction::accumulatorBytes(t, n));
      OrderedReduction red(t, ReduceOp::kAvg, n, count, want.data(), acc.data());
      for (int r = 0; r < n; ++r) red.add(in[r].data());

      std::vector<const void*> ptrs;
      for (auto& v : in) ptrs.push_back(v.data());
      std::vector<char> got(count * es), block(OrderedReduction::blockScratchBytes(t, n, count));
      OrderedReduction::reduceAll(t, ReduceOp::kAvg, ptrs, count, got.data(), block.data());
      EXPECT_EQ(std::memcmp(got.data(), want.data(), want.size()), 0)
          << toString(t) << " N = " << n;
      OrderedReduction::reduceAll(t, ReduceOp::kAvg, ptrs, count, in[n / 2].data(), block.data());
      EXPECT_EQ(std::memcmp(in[n / 2].data(), want.data(), want.size()), 0)
          << toString(t) << " N = " << n << " in place";
    }
  }
}

TEST(OrderedReduction, NoElementsReadNoOperand) {
  std::vector<char> acc(OrderedReduction::accumulatorBytes(DataType::kFloat32, 3));
  OrderedReduction red(DataType::kFloat32, ReduceOp::kSum, 3, 0, nullptr, acc.data());
  for (int r = 0; r < 3; ++r) red.add(nullptr);
  EXPECT_EQ(red.next(), 3);
}

}  // namespace
}  // namespace gflow::kernels
