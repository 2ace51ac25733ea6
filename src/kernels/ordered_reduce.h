// The reduction of reproducible mode: N operands x_0 .. x_{N-1}, handed over
// one at a time in rank order, reduced element by element as
//   ((x_0 op x_1) op x_2) ... op x_{N-1}
// in one accumulation type (float32 for float16, bfloat16 and float8, which
// are rounded once at the end; the element type otherwise), then divided
// once by N for avg (one operand, N == 1, is copied as it is). Every
// algorithm of reproducible mode (the host backend's fixed order, the
// shared-memory backend's paths) reduces through this one piece, so they
// give the same bits.
#pragma once

#include <cstddef>

#include "gflow/types.h"
#include "kernels/reduce.h"

namespace gflow::kernels {

class OrderedReduction {
 public:
  // Bytes of accumulator scratch per element (widening types: a float32).
  static size_t accumulatorBytes(DataType dtype);
  // Whether `dtype` accumulates in float32.
  static bool widens(DataType dtype);

  // `count` elements into `dst` from `n` operands. `acc`: count *
  // accumulatorBytes(dtype) bytes of scratch; `tmp`: count floats when
  // widens(dtype), else unused (may be null). Throws what reduceFn throws
  // for an op that does not apply to the type.
  OrderedReduction(DataType dtype, ReduceOp op, int n, size_t count, void* dst, void* acc,
                   float* tmp);

  // Operand `next()` (0, 1, ... in order). An operand must stay readable
  // until the next add(). `dst` may be one of the operands: it is written
  // only by the last add() (which may read it in the same call), and
  // operands before the last are consumed by then.
  void add(const void* x);
  int next() const { return next_; }

 private:
  void finish();

  const DataType dtype_;
  const ReduceOp op_;
  const int n_;
  const size_t count_;
  const bool wide_;
  const ReduceFn fn_;
  char* dst_;
  char* acc_;
  float* tmp_;
  const char* prev_ = nullptr;  // the running result (not widening)
  int next_ = 0;
};

}  // namespace gflow::kernels
