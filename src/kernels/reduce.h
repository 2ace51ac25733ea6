// Reduction kernels: the (dtype, op) -> function table that every algorithm
// calls. Algorithms move bytes; they never template over element types.
//
// float16 / bfloat16 / float8 are reduced by converting to float32, applying the
// op and rounding back once (round to nearest even); complex types add their
// parts; bool reduces 0/1 values ("or" for sum and max, "and" for prod and
// min); the bitwise ops act on the bytes of the integer types. Min/max propagate NaN (if either
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

// Never null; throws gflow::Error(kInvalidArgument) for values outside the
// enums and for an op that does not apply to the type (supportsReduceOp).
ReduceFn reduceFn(DataType dtype, ReduceOp op);

// data[i] = data[i] / divisor, in the element type (integers truncate toward
// zero; half and float8 types compute in float32 and round once; complex
// types divide both parts). Throws kInvalidArgument for bool.
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
// float8 (OCP E4M3FN and E5M2): widening is exact; narrowing rounds to nearest
// even, E4M3FN turning overflow and inf into NaN, E5M2 overflow into inf.
float float8e4m3ToFloat(uint8_t b);
uint8_t floatToFloat8e4m3(float f);
float float8e5m2ToFloat(uint8_t b);
uint8_t floatToFloat8e5m2(float f);

}  // namespace gflow::kernels
