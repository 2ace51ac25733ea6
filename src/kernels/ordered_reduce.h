// The reduction of reproducible mode: N operands x_0 .. x_{N-1}, handed over
// one at a time in rank order, reduced element by element by one fixed
// pairwise tree over the ranks, in one accumulation type (float32 for
// float16, bfloat16 and float8, which are rounded once at the end; the
// element type otherwise), then divided once by N for avg (one operand,
// N == 1, is copied as it is).
//
// The tree is halving-doubling's (backend/host/halving_doubling.cc, fold.h):
// with p the largest power of two <= N and rem = N - p, the first 2 rem
// ranks pair up as leaves (x_0 op x_1), (x_2 op x_3), ..., the other ranks
// are leaves by themselves, and the p leaves are combined in a perfect
// binary tree, neighbours first, the left (lower ranks') operand first at
// every node. For N = 4: (x_0 op x_1) op (x_2 op x_3). So the network's
// halving-doubling, whose every level is a pairwise swap, computes exactly
// these bits for the types that do not widen, and every other path of
// reproducible mode (the host backend's owner-computes exchange, the
// shared-memory backend's paths) reduces through this one piece.
#pragma once

#include <array>
#include <cstddef>
#include <vector>

#include "gflow/types.h"
#include "kernels/reduce.h"

namespace gflow::kernels {

class OrderedReduction {
 public:
  // Bytes of scratch per element for `n` operands: one accumulator (a
  // float32 for the widening types) per level of the tree, plus one.
  static size_t accumulatorBytes(DataType dtype, int n);
  // Whether `dtype` accumulates in float32.
  static bool widens(DataType dtype);

  // `count` elements into `dst` from `n` operands. `acc`: count *
  // accumulatorBytes(dtype, n) bytes of scratch. Throws what reduceFn
  // throws for an op that does not apply to the type.
  OrderedReduction(DataType dtype, ReduceOp op, int n, size_t count, void* dst, void* acc);

  // Operand `next()` (0, 1, ... in order). An operand must stay readable
  // until the next add() returns. `dst` may be one of the operands: it is
  // written only by the last add(), after every other operand has been
  // read (the last one may be read in the same pass).
  void add(const void* x);
  int next() const { return next_; }

  // All `operands` at once (each readable throughout; `dst` may be one of
  // them), the same bits as add() in rank order, a block of kBlock elements
  // at a time so that the partial sums stay in the cache. `acc`:
  // blockScratchBytes(dtype, operands.size(), count) bytes.
  static constexpr size_t kBlock = 2048;
  static size_t blockScratchBytes(DataType dtype, int n, size_t count);
  static void reduceAll(DataType dtype, ReduceOp op, const std::vector<const void*>& operands,
                        size_t count, void* dst, void* acc);

 private:
  // A node of the tree waiting for its right neighbour: at stack position
  // i its data is slot(i) or, for the types that do not widen, an operand.
  struct Node {
    int level;
    const char* data;
  };
  char* slot(size_t i) const { return acc_ + i * count_ * accEs_; }
  void push(const char* leaf);
  void finish();

  const DataType dtype_;
  const ReduceOp op_;
  const int n_;
  const size_t count_;
  const bool wide_;
  const size_t accEs_;
  const ReduceFn fn_;
  const int pairs_;   // rem: the first 2 rem operands pair up as leaves
  const int leaves_;  // p
  char* dst_;
  char* acc_;
  std::array<Node, 32> stack_;  // levels of an int world size, plus one
  size_t depth_ = 0;
  const char* pending_ = nullptr;  // the left operand of a leaf pair
  int next_ = 0;
  int pushed_ = 0;  // leaves so far
};

}  // namespace gflow::kernels
