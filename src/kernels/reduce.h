// Reduction kernels: the (dtype, op) -> function table that every algorithm
// calls. Algorithms move bytes; they never template over element types.
//
// float16 / bfloat16 are reduced by converting to float32, applying the op and
// rounding back once (round to nearest even). Min/max propagate NaN (if either
// input is NaN the result is NaN), so the result never depends on operand
// order. All kernels are deterministic: the same inputs give the same bits on
// every rank and every ISA.
#pragma once

#include <cstddef>
#include <cstdint>

#include "gflow/types.h"

namespace gflow::kernels {

// dst[i] = a[i] op b[i] for i in [0, count). dst may alias a or b exactly
// (never partially). kAvg uses the kSum kernel (the division happens once,
// see divide()).
using ReduceFn = void (*)(void* dst, const void* a, const void* b, size_t count);

// Never null for valid enums; throws gflow::Error(kInvalidArgument) otherwise.
ReduceFn reduceFn(DataType dtype, ReduceOp op);

// data[i] = data[i] / divisor, in the element type (integers truncate toward
// zero; half types compute in float32 and round once).
void divide(void* data, size_t count, DataType dtype, int64_t divisor);

enum class Isa : uint8_t { kBaseline = 0, kAvx2 = 1, kAvx512 = 2 };
const char* toString(Isa isa);
// The best ISA this CPU supports (cpuid + xgetbv, checked once).
Isa detectedIsa();
// The ISA the table currently dispatches to.
Isa activeIsa();
// Switches the dispatch table (tests and benchmarks compare ISAs). Returns
// false, changing nothing, if the CPU lacks `isa`. Not thread-safe against
// concurrent reductions.
bool setIsa(Isa isa);

// Scalar conversions (round to nearest even; NaN stays NaN, inf stays inf).
float halfToFloat(uint16_t h);
uint16_t floatToHalf(float f);
float bfloat16ToFloat(uint16_t b);
uint16_t floatToBfloat16(float f);

}  // namespace gflow::kernels
