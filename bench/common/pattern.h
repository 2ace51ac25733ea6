// Input patterns whose allreduce has an exact, closed-form result in every
// data type, so a sweep can count wrong elements with exact comparison
// (#wrong) instead of a tolerance that would hide small errors.
//
// Every value is a small positive integer chosen per (dtype, op, world size):
//   sum, avg  1..k with k*size within the type's exact integer range
//             (bf16: 256, fp16: 2048, uint8: 255), so every partial sum,
//             in any order, is exact;
//   min, max  1..120 (exact in every type, uint8 and bf16 included);
//   prod      1 or 2, with at most as many 2s per element as the type has
//             exponent room (uint8: 7, fp16: 15, ...): products are powers
//             of two, exact in any order.
// avg expects the exact sum divided by the world size, computed in double and
// rounded once to the type (integer types truncate), as gflow defines it.
// Patterns are periodic in the element index, so the expected result is
// precomputed for one period and the check is a byte comparison.
#pragma once

#include <cstddef>
#include <cstdint>
#include <vector>

#include "gflow/types.h"

namespace gflow::bench {

class CheckPattern {
 public:
  CheckPattern(DataType dtype, ReduceOp op, int worldSize);

  // Writes rank `rank`'s input: `count` elements at `buf`.
  void fillInput(int rank, void* buf, size_t count) const;
  // Number of elements of `result` that differ from the exact result, for
  // `count` elements from element `offset` of the reduction on.
  int64_t countWrong(const void* result, size_t count, size_t offset = 0) const;

 private:
  double value(int rank, size_t j) const;  // rank's element j (j < period_)

  DataType dtype_;
  ReduceOp op_;
  size_t esize_;
  size_t period_ = 1;
  int sumMax_ = 8;                 // sum/avg values are 1..sumMax_
  int prodMax_ = 0;                // most 2s in one product
  std::vector<uint8_t> expected_;  // period_ elements, encoded
};

// Fills `count` elements of `dtype` at `buf` with `value` (a small integer).
void fillValue(DataType dtype, double value, void* buf, size_t count);

// Rounds `value` to `dtype` (round to nearest even; integers truncate) and
// writes the encoding at `dst`.
void encodeValue(DataType dtype, double value, void* dst);
// Whether the sweep's value patterns cover `dtype` (not bool, float8 or
// complex: the C++ tests check those against exact references).
bool sweepable(DataType dtype);

}  // namespace gflow::bench
