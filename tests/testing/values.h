// Typed element access for tests: read/write element i of a buffer of any
// gflow dtype as a double. Half types go through the kernels' scalar
// conversions, which tests/kernels checks bit-for-bit against F16C hardware.
#pragma once

#include <cstddef>
#include <cstdint>
#include <vector>

#include "gflow/types.h"

namespace gflow::testing {

double getValue(const void* buf, size_t i, DataType t);
void setValue(void* buf, size_t i, DataType t, double v);
// Rounds v to what dtype `t` can hold (integers wrap like the kernels do).
double roundTo(DataType t, double v);

// Small-integer inputs for which every op's result is exact in every dtype
// for up to 8 ranks (so results can be compared exactly). A complex element
// is (v, -v) and reads back as v (NaN if its parts broke that rule); bool
// elements are 0 or 1.
double exactInput(int rank, size_t i, ReduceOp op, DataType t);
// The exact expected result of reducing exactInput over `n` ranks.
double exactExpected(int n, size_t i, ReduceOp op, DataType t);

// Every dtype but the quantized ones (whose results are not exact: they
// have tests of their own, quantized_allreduce_test.cc) and every op; a loop
// over both skips the pairs for which supportsReduceOp() is false (a test of
// the refusal takes them on purpose). A quantized element reads as its
// block's first value and is written as a block of kQuantBlock equal values.
const std::vector<DataType>& allDataTypes();
const std::vector<ReduceOp>& allReduceOps();

}  // namespace gflow::testing
