// Scalar building blocks shared by every CPU kernel file: bit casts, the
// float16 / bfloat16 conversions and the per-element semantics of each op.
// The SIMD kernels must reproduce these bit for bit; the tests hold them to it.
//
// Everything here has internal linkage on purpose. This header is compiled into
// the baseline, AVX2 and AVX-512 translation units with different -m flags; an
// inline function with external linkage would be emitted once per TU and the
// linker would keep an arbitrary copy, so baseline code could end up calling an
// AVX-512 encoded copy and die with SIGILL on an older CPU. For the same reason
// the kernel files avoid inline library templates (std::min, std::isnan).
#pragma once

#include <cstddef>
#include <cstdint>
#include <cstring>
#include <type_traits>

namespace gflow::kernels::cpu {
namespace {

// ---- bit casts ---------------------------------------------------------------

inline uint32_t bitsOf(float f) {
  uint32_t u;
  std::memcpy(&u, &f, sizeof u);
  return u;
}
inline uint64_t bitsOf(double d) {
  uint64_t u;
  std::memcpy(&u, &d, sizeof u);
  return u;
}
inline float floatFromBits(uint32_t u) {
  float f;
  std::memcpy(&f, &u, sizeof f);
  return f;
}
inline double doubleFromBits(uint64_t u) {
  double d;
  std::memcpy(&d, &u, sizeof d);
  return d;
}

// Every NaN a reduction produces is replaced by the positive quiet NaN of its
// type. x86 picks the first operand's payload when both inputs are NaN and the
// compiler may swap the operands of a commutative op, so without this the
// payload would depend on operand order, on the ISA and on the compiler.
constexpr uint32_t kNanF32 = 0x7FC00000u;
constexpr uint64_t kNanF64 = 0x7FF8000000000000ull;

// ---- float16 (IEEE binary16) ------------------------------------------------

// Exact; a signalling NaN comes back quiet (the quiet bit is set), like
// VCVTPH2PS.
inline float halfToFloatScalar(uint16_t h) {
  const uint32_t sign = static_cast<uint32_t>(h & 0x8000u) << 16;
  const uint32_t exp = (h >> 10) & 0x1Fu;
  uint32_t mant = h & 0x3FFu;
  uint32_t bits;
  if (exp == 0x1F) {
    bits = sign | 0x7F800000u | (mant << 13) | (mant != 0 ? 0x00400000u : 0u);
  } else if (exp != 0) {
    bits = sign | ((exp + 112) << 23) | (mant << 13);  // rebias 15 -> 127
  } else if (mant == 0) {
    bits = sign;
  } else {
    // Subnormal half: value = mant * 2^-24; normalize into a float32 normal.
    uint32_t e = 113;  // the exponent field of 2^-14, the top subnormal binade
    while ((mant & 0x400u) == 0) {
      mant <<= 1;
      --e;
    }
    bits = sign | (e << 23) | ((mant & 0x3FFu) << 13);
  }
  return floatFromBits(bits);
}

// Round to nearest even, overflow to inf, NaN stays NaN with the quiet bit set
// and the top payload bits kept: the same bits as VCVTPS2PH with imm8 = 0.
inline uint16_t floatToHalfScalar(float f) {
  const uint32_t x = bitsOf(f);
  const auto sign = static_cast<uint16_t>((x >> 16) & 0x8000u);
  const uint32_t ax = x & 0x7FFFFFFFu;
  if (ax > 0x7F800000u) {  // NaN
    return static_cast<uint16_t>(sign | 0x7E00u | ((ax >> 13) & 0x3FFu));
  }
  if (ax >= 0x477FF000u) return static_cast<uint16_t>(sign | 0x7C00u);  // >= 65520: inf
  if (ax >= 0x38800000u) {                                              // >= 2^-14: a normal half
    uint32_t h = (ax >> 13) - (112u << 10);
    const uint32_t rest = ax & 0x1FFFu;
    if (rest > 0x1000u || (rest == 0x1000u && (h & 1u) != 0)) ++h;  // may carry into exp
    return static_cast<uint16_t>(sign | h);
  }
  if (ax <= 0x33000000u) return sign;  // <= 2^-25: ties to even gives zero
  // Subnormal half: count units of 2^-24 in the 24-bit significand.
  const uint32_t e = ax >> 23;  // 102..112
  const uint32_t m = (ax & 0x7FFFFFu) | 0x800000u;
  const uint32_t shift = 126 - e;  // 14..24
  uint32_t h = m >> shift;
  const uint32_t rest = m & ((1u << shift) - 1);
  const uint32_t half = 1u << (shift - 1);
  if (rest > half || (rest == half && (h & 1u) != 0)) ++h;  // 0x400 is the min normal
  return static_cast<uint16_t>(sign | h);
}

// ---- bfloat16 -------------------------------------------------------------------

inline float bfloat16ToFloatScalar(uint16_t b) {
  return floatFromBits(static_cast<uint32_t>(b) << 16);
}

// Round to nearest even by integer add (a carry into the exponent is the correct
// rounding, up to inf); NaN keeps sign and top payload and is made quiet, since
// rounding could otherwise turn it into inf.
inline uint16_t floatToBfloat16Scalar(float f) {
  const uint32_t x = bitsOf(f);
  if ((x & 0x7FFFFFFFu) > 0x7F800000u) return static_cast<uint16_t>((x >> 16) | 0x40u);
  return static_cast<uint16_t>((x + 0x7FFFu + ((x >> 16) & 1u)) >> 16);
}

// ---- float8 (OCP 8-bit floating point) ------------------------------------------
// E4M3FN: bias 7, no inf, S.1111.111 is NaN, 448 the largest finite value.
// E5M2: bias 15, IEEE-like (inf and NaN). Widening is exact; narrowing rounds to
// nearest even, as PyTorch's casts do: E4M3FN turns what rounds past 448
// (and inf) into NaN, E5M2 turns what rounds past 57344 into inf. A NaN keeps
// its sign and becomes the format's quiet NaN (0x7F / 0x7E).
template <int kExpBits, int kManBits, bool kFiniteOnly>
struct Float8Format {
  static constexpr int kExp = kExpBits;
  static constexpr int kMan = kManBits;
  static constexpr bool kFinite = kFiniteOnly;
  static constexpr int kBias = (1 << (kExpBits - 1)) - 1;
  static constexpr uint8_t kNan = kFiniteOnly ? 0x7F : 0x7E;
  static constexpr uint8_t kInf = kFiniteOnly ? 0x7F : 0x7C;  // E4M3FN: NaN
  // The first bit pattern past the largest finite value.
  static constexpr uint32_t kOverflow = kFiniteOnly ? 0x7F : 0x7C;
};
using E4M3 = Float8Format<4, 3, true>;
using E5M2 = Float8Format<5, 2, false>;

template <class Fmt>
inline float float8ToFloatScalar(uint8_t b) {
  constexpr int kExpBits = Fmt::kExp, kMan = Fmt::kMan;
  const uint32_t sign = static_cast<uint32_t>(b & 0x80u) << 24;
  const uint32_t exp = (b >> kMan) & ((1u << kExpBits) - 1);
  const uint32_t man = b & ((1u << kMan) - 1);
  const uint32_t top = (1u << kExpBits) - 1;
  if (Fmt::kFinite ? (exp == top && man == ((1u << kMan) - 1)) : exp == top) {
    if (!Fmt::kFinite && man == 0) return floatFromBits(sign | 0x7F800000u);  // inf
    return floatFromBits(sign | kNanF32);
  }
  if (exp == 0) {  // subnormal: man units of 2^(1 - bias - kMan), exact in float32
    const float unit = floatFromBits(static_cast<uint32_t>(127 + 1 - Fmt::kBias - kMan) << 23);
    const float v = static_cast<float>(man) * unit;
    return sign ? -v : v;
  }
  return floatFromBits(sign | ((exp - Fmt::kBias + 127) << 23) | (man << (23 - kMan)));
}

template <class Fmt>
inline uint8_t floatToFloat8Scalar(float f) {
  constexpr int kMan = Fmt::kMan;
  const uint32_t x = bitsOf(f);
  const auto sign = static_cast<uint8_t>((x >> 24) & 0x80u);
  const uint32_t ax = x & 0x7FFFFFFFu;
  if (ax > 0x7F800000u) return static_cast<uint8_t>(sign | Fmt::kNan);
  if (ax == 0x7F800000u) return static_cast<uint8_t>(sign | Fmt::kInf);
  const int e = static_cast<int>(ax >> 23) - 127;
  const uint32_t m = (ax & 0x7FFFFFu) | 0x800000u;
  uint32_t h;
  if (e < 1 - Fmt::kBias) {  // below the normals: units of the smallest subnormal
    const int shift = 24 - Fmt::kBias - kMan - e;
    if (ax < 0x00800000u || shift > 25) return sign;  // rounds to zero
    h = m >> shift;
    const uint32_t rest = m & ((1u << shift) - 1);
    const uint32_t half = 1u << (shift - 1);
    if (rest > half || (rest == half && (h & 1u) != 0)) ++h;  // may become the min normal
  } else {
    h = (static_cast<uint32_t>(e + Fmt::kBias) << kMan) | ((m & 0x7FFFFFu) >> (23 - kMan));
    const uint32_t rest = m & ((1u << (23 - kMan)) - 1);
    const uint32_t half = 1u << (22 - kMan);
    if (rest > half || (rest == half && (h & 1u) != 0)) ++h;  // may carry into exp
  }
  if (h >= Fmt::kOverflow) return static_cast<uint8_t>(sign | Fmt::kInf);
  return static_cast<uint8_t>(sign | h);
}

// ---- op semantics ---------------------------------------------------------------
// Floating point: IEEE arithmetic, every NaN result canonical. Min/max follow
// IEEE 754-2019 minimum/maximum: NaN if either input is NaN, and -0 < +0, so
// the result never depends on operand order.

inline float canonicalize(float r) {
  return r != r ? floatFromBits(kNanF32) : r;
}
inline double canonicalize(double r) {
  return r != r ? doubleFromBits(kNanF64) : r;
}
inline float orBits(float a, float b) {
  return floatFromBits(bitsOf(a) | bitsOf(b));
}
inline double orBits(double a, double b) {
  return doubleFromBits(bitsOf(a) | bitsOf(b));
}
inline float andBits(float a, float b) {
  return floatFromBits(bitsOf(a) & bitsOf(b));
}
inline double andBits(double a, double b) {
  return doubleFromBits(bitsOf(a) & bitsOf(b));
}

template <class F>
inline F fpMin(F a, F b) {
  if (a != a || b != b) return canonicalize(a + b);  // the sum of a NaN is a NaN
  if (a < b) return a;
  if (b < a) return b;
  return orBits(a, b);  // equal: the bits differ only for -0 / +0, and -0 wins
}

template <class F>
inline F fpMax(F a, F b) {
  if (a != a || b != b) return canonicalize(a + b);
  if (a < b) return b;
  if (b < a) return a;
  return andBits(a, b);  // +0 wins
}

// Integers wrap (two's complement). The arithmetic is done in an unsigned type
// because signed overflow is undefined behaviour: unsigned int for the types
// narrower than it (which would otherwise promote to int, where 65535 * 65535
// overflows), the type's own unsigned type above.
template <class T>
using WrapType =
    std::conditional_t<(sizeof(T) < sizeof(unsigned)), unsigned, std::make_unsigned_t<T>>;
template <class T>
inline T intSum(T a, T b) {
  using U = std::make_unsigned_t<T>;
  using W = WrapType<T>;
  return static_cast<T>(static_cast<U>(W(U(a)) + W(U(b))));
}
template <class T>
inline T intProd(T a, T b) {
  using U = std::make_unsigned_t<T>;
  using W = WrapType<T>;
  return static_cast<T>(static_cast<U>(W(U(a)) * W(U(b))));
}

// Column of each op in a kernel table; kAvg shares the kSum kernel. The
// arithmetic ops come first (lanes implement them); the bitwise ones act on
// the bytes, whatever the integer type.
enum KernelOp : int {
  kOpSum = 0,
  kOpMin = 1,
  kOpMax = 2,
  kOpProd = 3,
  kNumArithmeticOps = 4,
  kOpBand = 4,
  kOpBor = 5,
  kOpBxor = 6,
  kNumKernelOps = 7,
};

// One element of op kOp on the compute type C (float, double or an integer).
template <int kOp, class C>
inline C applyScalar(C a, C b) {
  static_assert(kOp >= 0 && kOp < kNumArithmeticOps);
  if constexpr (std::is_floating_point_v<C>) {
    if constexpr (kOp == kOpSum) {
      return canonicalize(a + b);
    } else if constexpr (kOp == kOpProd) {
      return canonicalize(a * b);
    } else if constexpr (kOp == kOpMin) {
      return fpMin(a, b);
    } else {
      return fpMax(a, b);
    }
  } else {
    if constexpr (kOp == kOpSum) {
      return intSum(a, b);
    } else if constexpr (kOp == kOpProd) {
      return intProd(a, b);
    } else if constexpr (kOp == kOpMin) {
      return a < b ? a : b;
    } else {
      return a < b ? b : a;
    }
  }
}

}  // namespace
}  // namespace gflow::kernels::cpu
