// The per-ISA kernel tables behind kernels/reduce.h. Each ISA lives in its own
// translation unit compiled with its -m flags (reduce_baseline.cc,
// reduce_avx2.cc, reduce_avx512.cc); reduce_table.cc detects the CPU and picks
// one. Tests and benchmarks reach a specific ISA through tableFor().
#pragma once

#include <cstddef>
#include <cstdint>

#include "kernels/reduce.h"

namespace gflow::kernels::cpu {

// Bulk conversions between a 16-bit float type and float32. Pointers need no
// alignment; dst and src must not overlap.
using WidenFn = void (*)(float* dst, const void* src, size_t count);
using NarrowFn = void (*)(void* dst, const float* src, size_t count);
// The same with a float32 multiply: narrow(src * scale), widen(src) * scale
// (one IEEE multiply, then the conversion: the same bits on every ISA).
using WidenScaledFn = void (*)(float* dst, const void* src, size_t count, float scale);
using NarrowScaledFn = void (*)(void* dst, const float* src, size_t count, float scale);

// Block quantization (block_quant.h): blocks = Q(src * scale + residual)
// (residual may be null; if not, it becomes what quantizing lost), and
// dst = D(blocks) * scale, for `count` float32 values.
using QuantizeFn = void (*)(void* blocks, const float* src, size_t count, float scale,
                            float* residual);
using DequantizeFn = void (*)(float* dst, const void* blocks, size_t count, float scale);

struct KernelTable {
  Isa isa;
  // [dtype][KernelOp]: sum, min, max, prod, band, bor, bxor (see scalar.h);
  // nullptr where the op does not apply to the type.
  ReduceFn reduce[kNumDataTypes][7];
  WidenFn halfToFloat;
  NarrowFn floatToHalf;
  WidenFn bfloat16ToFloat;
  NarrowFn floatToBfloat16;
  WidenScaledFn halfToFloatScaled;
  NarrowScaledFn floatToHalfScaled;
  WidenScaledFn bfloat16ToFloatScaled;
  NarrowScaledFn floatToBfloat16Scaled;
  // [0]: kQInt8, [1]: kQInt4.
  QuantizeFn quantize[2];
  DequantizeFn dequantize[2];
};

// The tables themselves. Calling into one whose ISA the CPU lacks raises
// SIGILL; use tableFor() unless the caller has checked.
const KernelTable& baselineTable();
const KernelTable& avx2Table();
const KernelTable& avx512Table();

// The table for `isa`, or nullptr if this CPU (or its OS) does not support it.
const KernelTable* tableFor(Isa isa);

}  // namespace gflow::kernels::cpu
