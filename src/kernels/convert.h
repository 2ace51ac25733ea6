// Wire conversions for mixed-precision compression: float32 data travels as
// float16 or bfloat16. Vectorised per ISA (F16C in the AVX2 table, AVX-512F
// in the AVX-512 table) behind the same run-time dispatch as the reduce
// kernels; every ISA gives the bits of the scalar reference.
#pragma once

#include <cstddef>

#include "gflow/types.h"

namespace gflow::kernels {

// dst[i] = round(src[i] * scale) to `wire` (kFloat16 or kBFloat16; round to
// nearest even; values beyond the wire type's range become inf). The float8
// types are also accepted (scalar code; reduce.h says how they round), for
// the reproducible allreduce's float32 accumulator.
// The quantized types (kQInt8, kQInt4) take `count` float32 values into
// wireElements(wire, count) blocks (the last one padded with zeros;
// cpu/block_quant.h says how), and only they take a `residual` (error
// feedback: `count` floats added to src * scale before quantizing, then
// set to what quantizing lost).
void narrow(void* dst, const float* src, size_t count, DataType wire, float scale = 1.0f,
            float* residual = nullptr);
// dst[i] = float(src[i]) * scale (the widening itself is exact; for the
// quantized types, `count` values of the blocks at src).
void widen(float* dst, const void* src, size_t count, DataType wire, float scale = 1.0f);
// True if any element is inf or NaN. Floating dtypes only (false otherwise).
bool anyNonFinite(const void* data, size_t count, DataType dtype);

}  // namespace gflow::kernels
