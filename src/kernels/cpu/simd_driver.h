// The loops shared by the SIMD kernel files. An ISA file describes each data
// type as a "lane" struct and these templates turn lanes into ReduceFn and
// conversion kernels, so the AVX2 and AVX-512 files hold only intrinsics:
//
//   struct Lane {
//     using T = ...;                        // element type in memory
//     using V = ...;                        // register type ops work on
//     static constexpr size_t kLanes = ...; // elements per V
//     static V load(const void* p);         // unaligned; half types widen to float32
//     static void store(void* p, V v);      // unaligned; half types round once (RNE)
//     static V sum(V, V), prod(V, V), min(V, V), max(V, V);
//   };
//
// The bitwise ops of the integer types, bool, float8 and complex are built
// here from shared pieces, the same in every table.
//
// Internal linkage for the same reason as scalar.h: each ISA file instantiates
// these with its own flags.
#pragma once

#include <cstddef>
#include <cstring>

#include "kernels/cpu/block_quant.h"
#include "kernels/cpu/kernel_table.h"
#include "kernels/cpu/scalar.h"

namespace gflow::kernels::cpu {
namespace {

template <class L, int kOp>
inline typename L::V applyLane(typename L::V a, typename L::V b) {
  if constexpr (kOp == kOpSum) {
    return L::sum(a, b);
  } else if constexpr (kOp == kOpProd) {
    return L::prod(a, b);
  } else if constexpr (kOp == kOpMin) {
    return L::min(a, b);
  } else {
    static_assert(kOp == kOpMax);
    return L::max(a, b);
  }
}

// dst = a op b. Elementwise only (no reassociation), so any vector width gives
// the bits of the scalar kernel. Four vectors per iteration keep enough loads in
// flight to run at memory bandwidth; all loads of an iteration come before its
// stores, which is safe because dst aliases a or b exactly or not at all. The
// tail goes through a full vector on a stack copy so it runs the same code as
// the body (no scalar fallback whose rounding could differ).
template <class L, int kOp>
void reduceLoop(void* dst, const void* a, const void* b, size_t count) {
  using T = typename L::T;
  using V = typename L::V;
  constexpr size_t kStep = L::kLanes * sizeof(T);
  const size_t vectors = count / L::kLanes;
  const auto* pa = static_cast<const unsigned char*>(a);
  const auto* pb = static_cast<const unsigned char*>(b);
  auto* pd = static_cast<unsigned char*>(dst);
  size_t v = 0;
  for (; v + 4 <= vectors; v += 4) {
    const size_t off = v * kStep;
    const V a0 = L::load(pa + off), a1 = L::load(pa + off + kStep);
    const V a2 = L::load(pa + off + 2 * kStep), a3 = L::load(pa + off + 3 * kStep);
    const V b0 = L::load(pb + off), b1 = L::load(pb + off + kStep);
    const V b2 = L::load(pb + off + 2 * kStep), b3 = L::load(pb + off + 3 * kStep);
    L::store(pd + off, applyLane<L, kOp>(a0, b0));
    L::store(pd + off + kStep, applyLane<L, kOp>(a1, b1));
    L::store(pd + off + 2 * kStep, applyLane<L, kOp>(a2, b2));
    L::store(pd + off + 3 * kStep, applyLane<L, kOp>(a3, b3));
  }
  for (; v < vectors; ++v) {
    const size_t off = v * kStep;
    L::store(pd + off, applyLane<L, kOp>(L::load(pa + off), L::load(pb + off)));
  }
  const size_t rest = count - vectors * L::kLanes;
  if (rest != 0) {
    const size_t off = vectors * kStep;
    alignas(64) T ta[L::kLanes] = {};
    alignas(64) T tb[L::kLanes] = {};
    alignas(64) T td[L::kLanes];
    std::memcpy(ta, pa + off, rest * sizeof(T));
    std::memcpy(tb, pb + off, rest * sizeof(T));
    L::store(td, applyLane<L, kOp>(L::load(ta), L::load(tb)));
    std::memcpy(pd + off, td, rest * sizeof(T));
  }
}

// dst[i] = convert(src[i]): Src::load then Dst::store, e.g. a float16 lane
// into a float32 lane (widen) or back (narrow). Both lanes share V and kLanes.
template <class Dst, class Src>
void convertLoop(void* dst, const void* src, size_t count) {
  static_assert(Dst::kLanes == Src::kLanes);
  constexpr size_t kLanes = Src::kLanes;
  const auto* ps = static_cast<const unsigned char*>(src);
  auto* pd = static_cast<unsigned char*>(dst);
  const size_t vectors = count / kLanes;
  for (size_t v = 0; v < vectors; ++v) {
    Dst::store(pd + v * kLanes * sizeof(typename Dst::T),
               Src::load(ps + v * kLanes * sizeof(typename Src::T)));
  }
  const size_t rest = count - vectors * kLanes;
  if (rest != 0) {
    alignas(64) typename Src::T ts[kLanes] = {};
    alignas(64) typename Dst::T td[kLanes];
    std::memcpy(ts, ps + vectors * kLanes * sizeof(typename Src::T),
                rest * sizeof(typename Src::T));
    Dst::store(td, Src::load(ts));
    std::memcpy(pd + vectors * kLanes * sizeof(typename Dst::T), td,
                rest * sizeof(typename Dst::T));
  }
}

template <class F32, class Half>
void widenLoop(float* dst, const void* src, size_t count) {
  convertLoop<F32, Half>(dst, src, count);
}
template <class F32, class Half>
void narrowLoop(void* dst, const float* src, size_t count) {
  convertLoop<Half, F32>(dst, src, count);
}

// Narrow/widen with a float32 multiply by `scale` on the float32 side (the
// float32 lane's prod, so NaN handling matches the reduce kernels).
template <class F32>
typename F32::V splat(float scale) {
  alignas(64) float s[F32::kLanes];
  for (float& x : s) x = scale;
  return F32::load(s);
}

template <class F32, class Half>
void narrowScaledLoop(void* dst, const float* src, size_t count, float scale) {
  constexpr size_t kLanes = F32::kLanes;
  const typename F32::V k = splat<F32>(scale);
  auto* pd = static_cast<unsigned char*>(dst);
  const size_t vectors = count / kLanes;
  for (size_t v = 0; v < vectors; ++v) {
    Half::store(pd + v * kLanes * sizeof(typename Half::T),
                F32::prod(F32::load(src + v * kLanes), k));
  }
  const size_t rest = count - vectors * kLanes;
  if (rest != 0) {
    alignas(64) float ts[kLanes] = {};
    alignas(64) typename Half::T td[kLanes];
    std::memcpy(ts, src + vectors * kLanes, rest * sizeof(float));
    Half::store(td, F32::prod(F32::load(ts), k));
    std::memcpy(pd + vectors * kLanes * sizeof(typename Half::T), td,
                rest * sizeof(typename Half::T));
  }
}

template <class F32, class Half>
void widenScaledLoop(float* dst, const void* src, size_t count, float scale) {
  constexpr size_t kLanes = F32::kLanes;
  const typename F32::V k = splat<F32>(scale);
  const auto* ps = static_cast<const unsigned char*>(src);
  const size_t vectors = count / kLanes;
  for (size_t v = 0; v < vectors; ++v) {
    F32::store(dst + v * kLanes,
               F32::prod(Half::load(ps + v * kLanes * sizeof(typename Half::T)), k));
  }
  const size_t rest = count - vectors * kLanes;
  if (rest != 0) {
    alignas(64) typename Half::T ts[kLanes] = {};
    alignas(64) float td[kLanes];
    std::memcpy(ts, ps + vectors * kLanes * sizeof(typename Half::T),
                rest * sizeof(typename Half::T));
    F32::store(td, F32::prod(Half::load(ts), k));
    std::memcpy(dst + vectors * kLanes, td, rest * sizeof(float));
  }
}

// ---- lanes every ISA shares ---------------------------------------------------

// One element per "vector": the driver then supplies the 4-way unrolled loop.
// Loads and stores go through memcpy because the buffers carry no alignment
// promise, not even the element's own. The baseline table is made of these;
// the SIMD tables use them for the types they have no intrinsics for.
template <class Elem>
struct ScalarLane {
  using T = Elem;
  using V = Elem;
  static constexpr size_t kLanes = 1;
  static V load(const void* p) {
    V v;
    std::memcpy(&v, p, sizeof v);
    return v;
  }
  static void store(void* p, V v) { std::memcpy(p, &v, sizeof v); }
  static V sum(V a, V b) { return applyScalar<kOpSum>(a, b); }
  static V prod(V a, V b) { return applyScalar<kOpProd>(a, b); }
  static V min(V a, V b) { return applyScalar<kOpMin>(a, b); }
  static V max(V a, V b) { return applyScalar<kOpMax>(a, b); }
};

// float8: widen to float32, apply the float32 op, round once.
template <class Fmt>
struct Float8Lane : ScalarLane<float> {
  using T = uint8_t;
  static V load(const void* p) {
    return float8ToFloatScalar<Fmt>(*static_cast<const unsigned char*>(p));
  }
  static void store(void* p, V v) { *static_cast<unsigned char*>(p) = floatToFloat8Scalar<Fmt>(v); }
};

// bool: any nonzero byte is true and every result is 0 or 1; sum and max are
// "or", prod and min "and".
struct BoolLane : ScalarLane<uint8_t> {
  static V load(const void* p) { return *static_cast<const unsigned char*>(p) != 0 ? 1 : 0; }
  static V sum(V a, V b) { return a | b; }
  static V prod(V a, V b) { return a & b; }
  static V min(V a, V b) { return a & b; }
  static V max(V a, V b) { return a | b; }
  static V bxor(V a, V b) { return a ^ b; }
};

// ---- kernels beyond a lane's four ops ----------------------------------------

// The bitwise ops of the integer types act on bytes alike: count elements of
// kSize bytes, in 64-bit words (vectorized by the compiler with each ISA's
// flags; the result is the same bits on every ISA).
template <int kOp, size_t kSize>
void bitwiseLoop(void* dst, const void* a, const void* b, size_t count) {
  const size_t bytes = count * kSize;
  const auto* pa = static_cast<const unsigned char*>(a);
  const auto* pb = static_cast<const unsigned char*>(b);
  auto* pd = static_cast<unsigned char*>(dst);
  auto apply = [](uint64_t x, uint64_t y) {
    if constexpr (kOp == kOpBand) return x & y;
    if constexpr (kOp == kOpBor) return x | y;
    static_assert(kOp == kOpBand || kOp == kOpBor || kOp == kOpBxor);
    return x ^ y;
  };
  size_t i = 0;
  for (; i + 8 <= bytes; i += 8) {
    uint64_t x, y;
    std::memcpy(&x, pa + i, 8);
    std::memcpy(&y, pb + i, 8);
    const uint64_t r = apply(x, y);
    std::memcpy(pd + i, &r, 8);
  }
  for (; i < bytes; ++i) pd[i] = static_cast<unsigned char>(apply(pa[i], pb[i]));
}

// bool xor on normalized bytes (BoolLane has no fifth op in the driver).
inline void boolXorLoop(void* dst, const void* a, const void* b, size_t count) {
  const auto* pa = static_cast<const unsigned char*>(a);
  const auto* pb = static_cast<const unsigned char*>(b);
  auto* pd = static_cast<unsigned char*>(dst);
  for (size_t i = 0; i < count; ++i) {
    pd[i] = BoolLane::bxor(BoolLane::load(pa + i), BoolLane::load(pb + i));
  }
}

// Complex sum: the real and imaginary parts are independent sums of the
// part's type, so a complex element is two elements of the lane's type.
template <class L>
void complexSumLoop(void* dst, const void* a, const void* b, size_t count) {
  reduceLoop<L, kOpSum>(dst, a, b, 2 * count);
}

template <class L>
constexpr void setRow(KernelTable& table, DataType dtype) {
  ReduceFn* row = table.reduce[static_cast<int>(dtype)];
  row[kOpSum] = &reduceLoop<L, kOpSum>;
  row[kOpMin] = &reduceLoop<L, kOpMin>;
  row[kOpMax] = &reduceLoop<L, kOpMax>;
  row[kOpProd] = &reduceLoop<L, kOpProd>;
}

// An integer type: its lane's four ops and the bytewise ones.
template <class L>
constexpr void setIntegerRow(KernelTable& table, DataType dtype) {
  setRow<L>(table, dtype);
  ReduceFn* row = table.reduce[static_cast<int>(dtype)];
  row[kOpBand] = &bitwiseLoop<kOpBand, sizeof(typename L::T)>;
  row[kOpBor] = &bitwiseLoop<kOpBor, sizeof(typename L::T)>;
  row[kOpBxor] = &bitwiseLoop<kOpBxor, sizeof(typename L::T)>;
}

// A block-quantized type: its reduce ops and conversions (block_quant.h),
// vectorised by the ISA file's compiler flags.
template <class Fmt>
constexpr void setBlockRow(KernelTable& table, DataType dtype, int slot) {
  ReduceFn* row = table.reduce[static_cast<int>(dtype)];
  row[kOpSum] = &blockReduceLoop<Fmt, kOpSum>;
  row[kOpMin] = &blockReduceLoop<Fmt, kOpMin>;
  row[kOpMax] = &blockReduceLoop<Fmt, kOpMax>;
  table.quantize[slot] = &quantizeLoop<Fmt>;
  table.dequantize[slot] = &dequantizeLoop<Fmt>;
}

// The rows every ISA builds from the shared lanes (complex from its own
// float32 and float64 lanes).
template <class F32, class F64>
constexpr void setSharedRows(KernelTable& t) {
  setRow<Float8Lane<E4M3>>(t, DataType::kFloat8E4M3);
  setRow<Float8Lane<E5M2>>(t, DataType::kFloat8E5M2);
  setRow<BoolLane>(t, DataType::kBool);
  ReduceFn* b = t.reduce[static_cast<int>(DataType::kBool)];
  b[kOpBand] = &reduceLoop<BoolLane, kOpMin>;
  b[kOpBor] = &reduceLoop<BoolLane, kOpMax>;
  b[kOpBxor] = &boolXorLoop;
  t.reduce[static_cast<int>(DataType::kComplex64)][kOpSum] = &complexSumLoop<F32>;
  t.reduce[static_cast<int>(DataType::kComplex128)][kOpSum] = &complexSumLoop<F64>;
  setBlockRow<QInt8Format>(t, DataType::kQInt8, 0);
  setBlockRow<QInt4Format>(t, DataType::kQInt4, 1);
}

// The whole table from one lane per data type. constexpr so each ISA's table
// is constant-initialized data: building it runs no code of that ISA.
// BF16Convert narrows arbitrary floats; BF16 may assume its input comes from a
// reduce op (no NaN but the canonical one).
template <class F32, class F16, class BF16, class F64, class I32, class I64, class U8, class I8,
          class I16, class BF16Convert = BF16>
constexpr KernelTable makeVectorTable(Isa isa) {
  KernelTable t{};
  t.isa = isa;
  setRow<F32>(t, DataType::kFloat32);
  setRow<F16>(t, DataType::kFloat16);
  setRow<BF16>(t, DataType::kBFloat16);
  setRow<F64>(t, DataType::kFloat64);
  setIntegerRow<I32>(t, DataType::kInt32);
  setIntegerRow<I64>(t, DataType::kInt64);
  setIntegerRow<U8>(t, DataType::kUInt8);
  setIntegerRow<I8>(t, DataType::kInt8);
  setIntegerRow<I16>(t, DataType::kInt16);
  setSharedRows<F32, F64>(t);
  t.halfToFloat = &widenLoop<F32, F16>;
  t.floatToHalf = &narrowLoop<F32, F16>;
  t.bfloat16ToFloat = &widenLoop<F32, BF16Convert>;
  t.floatToBfloat16 = &narrowLoop<F32, BF16Convert>;
  t.halfToFloatScaled = &widenScaledLoop<F32, F16>;
  t.floatToHalfScaled = &narrowScaledLoop<F32, F16>;
  t.bfloat16ToFloatScaled = &widenScaledLoop<F32, BF16Convert>;
  t.floatToBfloat16Scaled = &narrowScaledLoop<F32, BF16Convert>;
  return t;
}

}  // namespace
}  // namespace gflow::kernels::cpu
