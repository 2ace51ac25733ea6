// Reduction kernels against an independent reference, for every ISA this CPU
// runs. The reference shares no code with src/kernels/cpu: 16-bit floats are
// decoded with ldexp and rounded with nearbyint on scaled doubles, ops are done
// in double (exact, or rounded with enough spare bits that rounding again to the
// target is harmless) or in exact integer math.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <limits>
#include <random>
#include <string>
#include <tuple>
#include <type_traits>
#include <utility>
#include <vector>

#include "gflow/error.h"
#include "kernels/cpu/kernel_table.h"
#include "kernels/reduce.h"

namespace gflow::kernels {
namespace {

constexpr Isa kAllIsas[] = {Isa::kBaseline, Isa::kAvx2, Isa::kAvx512};
const std::vector<DataType> kAllTypes = [] {
  std::vector<DataType> v;
  for (int t = 0; t < kNumDataTypes; ++t) v.push_back(static_cast<DataType>(t));
  return v;
}();
const std::vector<ReduceOp> kAllOps = [] {
  std::vector<ReduceOp> v;
  for (int op = 0; op < kNumReduceOps; ++op) v.push_back(static_cast<ReduceOp>(op));
  return v;
}();

// Restores the dispatch table when a test switches ISA.
class IsaGuard {
 public:
  IsaGuard() : saved_(activeIsa()) {}
  ~IsaGuard() { setIsa(saved_); }
  IsaGuard(const IsaGuard&) = delete;
  IsaGuard& operator=(const IsaGuard&) = delete;

 private:
  Isa saved_;
};

template <class T>
T load(const uint8_t* p) {
  T v;
  std::memcpy(&v, p, sizeof v);
  return v;
}
template <class T>
void put(uint8_t* p, T v) {
  std::memcpy(p, &v, sizeof v);
}
uint32_t bits(float f) {
  return load<uint32_t>(reinterpret_cast<const uint8_t*>(&f));
}
uint64_t bits(double d) {
  return load<uint64_t>(reinterpret_cast<const uint8_t*>(&d));
}
float floatOf(uint32_t u) {
  return load<float>(reinterpret_cast<const uint8_t*>(&u));
}

// ---- reference 16-bit floats ---------------------------------------------------

struct Format {
  int expBits;
  int mantBits;
  int bias() const { return (1 << (expBits - 1)) - 1; }
  uint32_t expMask() const { return (1u << expBits) - 1; }
  uint32_t canonicalNan() const { return (expMask() << mantBits) | (1u << (mantBits - 1)); }
  uint32_t quietBit() const { return 1u << (mantBits - 1); }
};
constexpr Format kHalf{5, 10};
constexpr Format kBf16{8, 7};

bool isNan16(uint16_t b, Format f) {
  return ((b >> f.mantBits) & f.expMask()) == f.expMask() && (b & ((1u << f.mantBits) - 1)) != 0;
}

double decode16(uint16_t b, Format f) {
  const uint32_t mant = b & ((1u << f.mantBits) - 1);
  const uint32_t exp = (b >> f.mantBits) & f.expMask();
  double v;
  if (exp == f.expMask()) {
    v = mant != 0 ? std::numeric_limits<double>::quiet_NaN()
                  : std::numeric_limits<double>::infinity();
  } else if (exp == 0) {
    v = std::ldexp(static_cast<double>(mant), 1 - f.bias() - f.mantBits);
  } else {
    v = std::ldexp(static_cast<double>(mant + (1u << f.mantBits)),
                   static_cast<int>(exp) - f.bias() - f.mantBits);
  }
  return (b >> 15) != 0 ? -v : v;
}

// Round to nearest even; NaN gives the canonical quiet NaN.
uint16_t encode16(double v, Format f) {
  if (std::isnan(v)) return static_cast<uint16_t>(f.canonicalNan());
  const uint32_t sign = std::signbit(v) ? 0x8000u : 0u;
  const double a = std::fabs(v);
  const uint32_t inf = sign | (f.expMask() << f.mantBits);
  if (std::isinf(a)) return static_cast<uint16_t>(inf);
  const int minExp = 1 - f.bias();
  const int e = a == 0 ? minExp : std::max(std::ilogb(a), minExp);
  const double quantum = std::ldexp(1.0, e - f.mantBits);
  const double r = std::nearbyint(a / quantum) * quantum;  // power-of-two scaling is exact
  const double maxFinite = std::ldexp(2.0 - std::ldexp(1.0, -f.mantBits), f.bias());
  if (r > maxFinite) return static_cast<uint16_t>(inf);
  if (r < std::ldexp(1.0, minExp)) {
    return static_cast<uint16_t>(sign |
                                 static_cast<uint32_t>(r / std::ldexp(1.0, minExp - f.mantBits)));
  }
  const int e2 = std::ilogb(r);
  const auto mant =
      static_cast<uint32_t>(r / std::ldexp(1.0, e2 - f.mantBits)) - (1u << f.mantBits);
  return static_cast<uint16_t>(sign | (static_cast<uint32_t>(e2 + f.bias()) << f.mantBits) | mant);
}

// ---- reference float8 --------------------------------------------------------------
// Decoded by formula; encoded by searching the 256 codes for the nearest value
// (ties to the even code), with one code past the largest finite value
// standing for overflow: E4M3FN gives NaN there, E5M2 inf.

struct Format8 {
  int expBits;
  bool finiteOnly;  // E4M3FN: no inf, S.1111.111 is NaN
  int mantBits() const { return 7 - expBits; }
  int bias() const { return (1 << (expBits - 1)) - 1; }
  uint8_t nan() const { return finiteOnly ? 0x7F : 0x7E; }
  uint8_t overflow() const { return finiteOnly ? 0x7F : 0x7C; }
};
constexpr Format8 kE4M3{4, true};
constexpr Format8 kE5M2{5, false};

Format8 format8(DataType t) {
  return t == DataType::kFloat8E4M3 ? kE4M3 : kE5M2;
}

// The value of code b's magnitude bits as if every exponent were finite.
double magnitude8(uint8_t b, Format8 f) {
  const int m = f.mantBits();
  const uint32_t mant = b & ((1u << m) - 1), exp = (b >> m) & ((1u << f.expBits) - 1);
  if (exp == 0) return std::ldexp(static_cast<double>(mant), 1 - f.bias() - m);
  return std::ldexp(static_cast<double>(mant + (1u << m)), static_cast<int>(exp) - f.bias() - m);
}

bool isNan8(uint8_t b, Format8 f) {
  const uint8_t a = b & 0x7F;
  return f.finiteOnly ? a == 0x7F : a > 0x7C;
}

double decode8(uint8_t b, Format8 f) {
  const uint8_t a = b & 0x7F;
  double v;
  if (isNan8(b, f)) {
    v = std::numeric_limits<double>::quiet_NaN();
  } else if (!f.finiteOnly && a == 0x7C) {
    v = std::numeric_limits<double>::infinity();
  } else {
    v = magnitude8(a, f);
  }
  return (b & 0x80) != 0 ? -v : v;
}

uint8_t encode8(double v, Format8 f) {
  if (std::isnan(v)) return f.nan();
  const uint8_t sign = std::signbit(v) ? 0x80 : 0;
  const double a = std::fabs(v);
  const uint8_t over = f.overflow();  // its magnitude8 is the next value past the largest
  if (a > magnitude8(over, f)) return static_cast<uint8_t>(sign | over);
  // Magnitudes grow with the code: the last code at or below `a`, then the
  // nearer of it and the next (ties to the even code).
  int lo = 0, hi = over;
  while (hi - lo > 1) {
    const int mid = (lo + hi) / 2;
    (magnitude8(static_cast<uint8_t>(mid), f) <= a ? lo : hi) = mid;
  }
  const double dlo = a - magnitude8(static_cast<uint8_t>(lo), f);
  const double dhi = magnitude8(static_cast<uint8_t>(hi), f) - a;
  const int best = dlo < dhi ? lo : dhi < dlo ? hi : (lo % 2 == 0 ? lo : hi);
  return static_cast<uint8_t>(sign | best);  // `over` itself is NaN or inf
}

// ---- reference ops ----------------------------------------------------------------

double refFloatOp(ReduceOp op, double x, double y) {
  if (op == ReduceOp::kMin || op == ReduceOp::kMax) {
    if (std::isnan(x) || std::isnan(y)) return std::numeric_limits<double>::quiet_NaN();
    if (x == y && x == 0) {  // IEEE 754-2019 minimum/maximum: -0 < +0
      const bool negative = op == ReduceOp::kMin ? (std::signbit(x) || std::signbit(y))
                                                 : (std::signbit(x) && std::signbit(y));
      return negative ? -0.0 : 0.0;
    }
    if (op == ReduceOp::kMin) return x < y ? x : y;
    return x > y ? x : y;
  }
  return op == ReduceOp::kProd ? x * y : x + y;  // kSum and kAvg
}

template <class T>
T refIntOp(ReduceOp op, T x, T y) {
  using Wide = __int128;
  const Wide a = x, b = y;
  Wide r;
  switch (op) {
    case ReduceOp::kMin: r = a < b ? a : b; break;
    case ReduceOp::kMax: r = a > b ? a : b; break;
    case ReduceOp::kProd: r = a * b; break;
    case ReduceOp::kBand: r = a & b; break;
    case ReduceOp::kBor: r = a | b; break;
    case ReduceOp::kBxor: r = a ^ b; break;
    default: r = a + b; break;
  }
  // Two's complement wrap: keep the low bits.
  using U = std::make_unsigned_t<T>;
  return static_cast<T>(static_cast<U>(static_cast<unsigned __int128>(r)));
}

// ---- quantized blocks, from the contract in cpu/block_quant.h -----------------

float quantMax(DataType t) {
  return t == DataType::kQInt8 ? 127.0f : 7.0f;
}

// The block's kQuantBlock values: q * scale, q int8 or a sign-extended nibble.
std::vector<float> refDequant(DataType t, const uint8_t* p) {
  const float s = load<float>(p);
  std::vector<float> y(kQuantBlock);
  for (size_t i = 0; i < kQuantBlock; ++i) {
    int q;
    if (t == DataType::kQInt8) {
      q = static_cast<int8_t>(p[4 + i]);
    } else {
      const int nib = i % 2 == 0 ? p[4 + i / 2] & 0xF : p[4 + i / 2] >> 4;
      q = nib >= 8 ? nib - 16 : nib;
    }
    y[i] = static_cast<float>(q) * s;
  }
  return y;
}

// The block of y: NaN block for any inf/NaN, zero block below 2^-120, else
// scale = m / Q and q = nearbyint(y * (Q / m)) clamped.
void refQuant(DataType t, const std::vector<float>& y, uint8_t* out) {
  const float qmax = quantMax(t);
  bool bad = false;
  float m = 0.0f;
  for (float v : y) {
    bad |= !std::isfinite(v);
    m = std::max(m, std::fabs(v));
  }
  float s = 0.0f;
  std::vector<int> q(kQuantBlock, 0);
  if (bad) {
    s = std::numeric_limits<float>::quiet_NaN();
  } else if (m >= std::ldexp(1.0f, -120)) {
    s = m / qmax;
    const float inv = qmax / m;
    for (size_t i = 0; i < kQuantBlock; ++i) {
      const float r = std::nearbyint(y[i] * inv);
      q[i] = static_cast<int>(std::clamp(r, -qmax, qmax));
    }
  }
  put<uint32_t>(out, bad ? 0x7FC00000u : bits(s));
  for (size_t i = 0; i < kQuantBlock; ++i) {
    if (t == DataType::kQInt8) {
      out[4 + i] = static_cast<uint8_t>(q[i]);
    } else if (i % 2 == 0) {
      out[4 + i / 2] = static_cast<uint8_t>((q[i] & 0xF) | ((q[i + 1] & 0xF) << 4));
    }
  }
}

// out = a op b for one element of dtype.
void refElement(DataType dtype, ReduceOp op, const uint8_t* a, const uint8_t* b, uint8_t* out) {
  switch (dtype) {
    case DataType::kFloat32: {
      const double r = refFloatOp(op, load<float>(a), load<float>(b));
      put<uint32_t>(out, std::isnan(r) ? 0x7FC00000u : bits(static_cast<float>(r)));
      return;
    }
    case DataType::kFloat64: {
      const double r = refFloatOp(op, load<double>(a), load<double>(b));
      put<uint64_t>(out, std::isnan(r) ? 0x7FF8000000000000ull : bits(r));
      return;
    }
    case DataType::kFloat16:
    case DataType::kBFloat16: {
      const Format f = dtype == DataType::kFloat16 ? kHalf : kBf16;
      const double r =
          refFloatOp(op, decode16(load<uint16_t>(a), f), decode16(load<uint16_t>(b), f));
      put<uint16_t>(out, encode16(r, f));
      return;
    }
    case DataType::kInt32: put(out, refIntOp(op, load<int32_t>(a), load<int32_t>(b))); return;
    case DataType::kInt64: put(out, refIntOp(op, load<int64_t>(a), load<int64_t>(b))); return;
    case DataType::kUInt8: put(out, refIntOp(op, load<uint8_t>(a), load<uint8_t>(b))); return;
    case DataType::kInt8: put(out, refIntOp(op, load<int8_t>(a), load<int8_t>(b))); return;
    case DataType::kInt16: put(out, refIntOp(op, load<int16_t>(a), load<int16_t>(b))); return;
    case DataType::kBool: {
      const bool x = *a != 0, y = *b != 0;
      const bool orLike = op == ReduceOp::kSum || op == ReduceOp::kMax || op == ReduceOp::kBor;
      *out = op == ReduceOp::kBxor ? (x != y) : orLike ? (x || y) : (x && y);
      return;
    }
    case DataType::kFloat8E4M3:
    case DataType::kFloat8E5M2: {
      const Format8 f = format8(dtype);
      *out = encode8(refFloatOp(op, decode8(*a, f), decode8(*b, f)), f);
      return;
    }
    case DataType::kComplex64:
    case DataType::kComplex128: {  // sum: part by part
      const DataType part = dtype == DataType::kComplex64 ? DataType::kFloat32 : DataType::kFloat64;
      const size_t half = dataTypeSize(part);
      refElement(part, op, a, b, out);
      refElement(part, op, a + half, b + half, out + half);
      return;
    }
    case DataType::kQInt8:
    case DataType::kQInt4: {  // in float32 (double rounded once gives float's sum)
      std::vector<float> x = refDequant(dtype, a);
      const std::vector<float> y = refDequant(dtype, b);
      for (size_t i = 0; i < kQuantBlock; ++i) {
        // An inf or NaN operand value makes the result the NaN block.
        const bool finite = std::isfinite(x[i]) && std::isfinite(y[i]);
        x[i] = finite ? static_cast<float>(refFloatOp(op, x[i], y[i])) : NAN;
      }
      refQuant(dtype, x, out);
      return;
    }
  }
}

// ---- inputs: ordinary values, raw bit patterns (every class) and specials -------

void fillRandom(DataType dtype, uint8_t* p, size_t n, std::mt19937_64& rng);
void refElement(DataType dtype, ReduceOp op, const uint8_t* a, const uint8_t* b, uint8_t* out);

void fillRandom(DataType dtype, uint8_t* p, size_t n, std::mt19937_64& rng) {
  const size_t size = dataTypeSize(dtype);
  std::uniform_real_distribution<double> unit(-2.0, 2.0);
  std::uniform_int_distribution<int> scale(-30, 30);
  std::uniform_int_distribution<int> kind(0, 9);
  for (size_t i = 0; i < n; ++i, p += size) {
    const int k = kind(rng);
    const uint64_t raw = rng();
    const double value = std::ldexp(unit(rng), scale(rng));  // a typical gradient-like value
    switch (dtype) {
      case DataType::kFloat32: {
        static const uint32_t kSpecial[] = {0x0,        0x80000000, 0x7F800000, 0xFF800000,
                                            0x7FC00000, 0xFFC00001, 0x7F800001, 0x1,
                                            0x807FFFFF, 0x7F7FFFFF};
        put<uint32_t>(p, k < 5   ? bits(static_cast<float>(value))
                         : k < 8 ? static_cast<uint32_t>(raw)
                                 : kSpecial[raw % 10]);
        break;
      }
      case DataType::kFloat64: {
        static const uint64_t kSpecial[] = {0x0,
                                            0x8000000000000000,
                                            0x7FF0000000000000,
                                            0xFFF0000000000000,
                                            0x7FF8000000000000,
                                            0xFFF8000000000123,
                                            0x7FF0000000000001,
                                            0x1,
                                            0x7FEFFFFFFFFFFFFF,
                                            0x000FFFFFFFFFFFFF};
        put<uint64_t>(p, k < 5 ? bits(value) : k < 8 ? raw : kSpecial[raw % 10]);
        break;
      }
      case DataType::kFloat16:
      case DataType::kBFloat16: {
        const Format f = dtype == DataType::kFloat16 ? kHalf : kBf16;
        static const uint16_t kHalfSpecial[] = {0x0,    0x8000, 0x7C00, 0xFC00, 0x7E00,
                                                0xFD01, 0x7C01, 0x1,    0x7BFF, 0x03FF};
        static const uint16_t kBfSpecial[] = {0x0,    0x8000, 0x7F80, 0xFF80, 0x7FC0,
                                              0xFFA1, 0x7F81, 0x1,    0x7F7F, 0x007F};
        const uint16_t special = (f.expBits == 5 ? kHalfSpecial : kBfSpecial)[raw % 10];
        put<uint16_t>(p, k < 4 ? encode16(value, f) : k < 8 ? static_cast<uint16_t>(raw) : special);
        break;
      }
      case DataType::kInt32: {
        static const int32_t kSpecial[] = {0, 1, -1, INT32_MIN, INT32_MAX};
        put<int32_t>(p, k < 7   ? static_cast<int32_t>(raw % 2001) - 1000
                        : k < 9 ? static_cast<int32_t>(raw)
                                : kSpecial[raw % 5]);
        break;
      }
      case DataType::kInt64: {
        static const int64_t kSpecial[] = {0, 1, -1, INT64_MIN, INT64_MAX};
        put<int64_t>(p, k < 7   ? static_cast<int64_t>(raw % 2001) - 1000
                        : k < 9 ? static_cast<int64_t>(raw)
                                : kSpecial[raw % 5]);
        break;
      }
      case DataType::kUInt8:
      case DataType::kBool:  // any byte: bool reads every nonzero byte as true
        put<uint8_t>(p, static_cast<uint8_t>(raw));
        break;
      case DataType::kInt8: put<int8_t>(p, static_cast<int8_t>(raw)); break;
      case DataType::kInt16: {
        static const int16_t kSpecial[] = {0, 1, -1, INT16_MIN, INT16_MAX};
        put<int16_t>(p, k < 7   ? static_cast<int16_t>(raw % 201) - 100
                        : k < 9 ? static_cast<int16_t>(raw)
                                : kSpecial[raw % 5]);
        break;
      }
      case DataType::kFloat8E4M3:
      case DataType::kFloat8E5M2: {  // typical values and every code
        const Format8 f = format8(dtype);
        put<uint8_t>(p, k < 5 ? encode8(std::ldexp(unit(rng), scale(rng) % 6), f)
                              : static_cast<uint8_t>(raw));
        break;
      }
      case DataType::kComplex64: fillRandom(DataType::kFloat32, p, 2, rng); break;
      case DataType::kComplex128: fillRandom(DataType::kFloat64, p, 2, rng); break;
      case DataType::kQInt8:
      case DataType::kQInt4: {  // mostly quantized gradients (1 in 10 holding inf/NaN), or any
                                // bytes
        if (k < 7) {
          std::vector<float> y(kQuantBlock);
          for (float& v : y) v = static_cast<float>(std::ldexp(unit(rng), scale(rng) % 8));
          if (k == 0) y[raw % kQuantBlock] = (raw & 1) ? INFINITY : NAN;
          refQuant(dtype, y, p);
        } else {
          for (size_t j = 0; j < size; ++j) p[j] = static_cast<uint8_t>(rng());
        }
        break;
      }
    }
  }
}

std::string hexBytes(const uint8_t* p, size_t n) {
  static const char kHex[] = "0123456789abcdef";
  std::string s = "0x";
  for (size_t i = n; i-- > 0;) {  // little endian: most significant byte last
    s += kHex[p[i] >> 4];
    s += kHex[p[i] & 15];
  }
  return s;
}

// ---- reduce: every ISA x dtype x op against the reference -----------------------

using ReduceParam = std::tuple<Isa, DataType, ReduceOp>;

class ReduceTest : public ::testing::TestWithParam<ReduceParam> {};

TEST_P(ReduceTest, MatchesReference) {
  const auto [isa, dtype, op] = GetParam();
  IsaGuard guard;
  if (!setIsa(isa)) GTEST_SKIP() << "CPU lacks " << toString(isa);
  const ReduceFn fn = reduceFn(dtype, op);
  ASSERT_NE(fn, nullptr);

  const size_t size = dataTypeSize(dtype);
  std::mt19937_64 rng(1234 + 100 * static_cast<int>(dtype) + static_cast<int>(op));
  const size_t counts[] = {0,  1,  2,  3,  7,   8,   15,  16,   17,   31,
                           33, 63, 64, 65, 127, 129, 255, 1023, 1025, 100003};
  enum Alias { kNone, kDstIsA, kDstIsB };
  for (size_t count : counts) {
    // A quantized element is a block of 128 values: 1025 of them are enough.
    if (isQuantized(dtype) && count > 1025) continue;
    for (Alias alias : {kNone, kDstIsA, kDstIsB}) {
      for (size_t offset : {size_t{0}, size_t{1}}) {  // 1: not even element-aligned
        SCOPED_TRACE("count " + std::to_string(count) + " alias " + std::to_string(alias) +
                     " offset " + std::to_string(offset));
        const size_t bytes = count * size;
        std::vector<uint8_t> abuf(bytes + 64), bbuf(bytes + 64), dbuf(bytes + 64, 0xA5);
        uint8_t* a = abuf.data() + offset;
        uint8_t* b = bbuf.data() + offset;
        fillRandom(dtype, a, count, rng);
        fillRandom(dtype, b, count, rng);
        std::vector<uint8_t> expected(bytes + 1);
        for (size_t i = 0; i < count; ++i) {
          refElement(dtype, op, a + i * size, b + i * size, expected.data() + i * size);
        }
        uint8_t* dst = alias == kDstIsA ? a : alias == kDstIsB ? b : dbuf.data() + offset;
        fn(dst, a, b, count);

        size_t mismatches = 0;
        for (size_t i = 0; i < count && mismatches < 5; ++i) {
          const uint8_t* got = dst + i * size;
          const uint8_t* want = expected.data() + i * size;
          if (std::memcmp(got, want, size) != 0) {
            ++mismatches;
            ADD_FAILURE() << "element " << i << ": got " << hexBytes(got, size) << " want "
                          << hexBytes(want, size);
          }
        }
        // Nothing past the end may be written.
        if (alias == kNone) {
          for (size_t i = offset + bytes; i < dbuf.size(); ++i) ASSERT_EQ(dbuf[i], 0xA5) << i;
        }
      }
    }
  }
}

std::string paramName(const ::testing::TestParamInfo<ReduceParam>& info) {
  return std::string(toString(std::get<0>(info.param))) + "_" +
         gflow::toString(std::get<1>(info.param)) + "_" + gflow::toString(std::get<2>(info.param));
}

// Every ISA x dtype x op that applies to the dtype.
std::vector<ReduceParam> validParams() {
  std::vector<ReduceParam> v;
  for (Isa isa : kAllIsas) {
    for (DataType t : kAllTypes) {
      for (ReduceOp op : kAllOps) {
        if (supportsReduceOp(t, op)) v.emplace_back(isa, t, op);
      }
    }
  }
  return v;
}

INSTANTIATE_TEST_SUITE_P(AllIsaTypeOp, ReduceTest, ::testing::ValuesIn(validParams()), paramName);

// Swapping the operands never changes a bit, NaN payloads and signed zeros
// included, on any ISA (each must also match the reference, so ISAs agree).
TEST(Reduce, OperandOrderDoesNotMatter) {
  IsaGuard guard;
  std::mt19937_64 rng(99);
  constexpr size_t kCount = 4099;
  for (Isa isa : kAllIsas) {
    if (!setIsa(isa)) continue;
    for (DataType dtype : kAllTypes) {
      const size_t bytes = kCount * dataTypeSize(dtype);
      std::vector<uint8_t> a(bytes), b(bytes), ab(bytes), ba(bytes);
      fillRandom(dtype, a.data(), kCount, rng);
      fillRandom(dtype, b.data(), kCount, rng);
      for (ReduceOp op : kAllOps) {
        if (!supportsReduceOp(dtype, op)) continue;
        const ReduceFn fn = reduceFn(dtype, op);
        fn(ab.data(), a.data(), b.data(), kCount);
        fn(ba.data(), b.data(), a.data(), kCount);
        EXPECT_EQ(ab, ba) << toString(isa) << " " << gflow::toString(dtype) << " "
                          << gflow::toString(op);
      }
    }
  }
}

TEST(Reduce, NanAndInfinity) {
  IsaGuard guard;
  const float inf = std::numeric_limits<float>::infinity();
  const float qnan = floatOf(0x7FC00000u);
  const float payloadNan = floatOf(0xFFA12345u);  // negative, signalling, with a payload
  const std::vector<float> a = {inf, -inf, inf, payloadNan, 1.0f, -0.0f, 3e38f, 2.0f, 0.0f};
  const std::vector<float> b = {-inf, -inf, 1.0f, 1.0f, payloadNan, 0.0f, 3e38f, qnan, inf};
  for (Isa isa : kAllIsas) {
    if (!setIsa(isa)) continue;
    SCOPED_TRACE(toString(isa));
    std::vector<float> out(a.size());
    reduceFn(DataType::kFloat32, ReduceOp::kSum)(out.data(), a.data(), b.data(), a.size());
    const uint32_t sumWant[] = {0x7FC00000, 0xFF800000, 0x7F800000, 0x7FC00000, 0x7FC00000,
                                0x00000000, 0x7F800000, 0x7FC00000, 0x7F800000};
    for (size_t i = 0; i < a.size(); ++i) EXPECT_EQ(bits(out[i]), sumWant[i]) << "sum " << i;
    reduceFn(DataType::kFloat32, ReduceOp::kProd)(out.data(), a.data(), b.data(), a.size());
    EXPECT_EQ(bits(out[0]), 0xFF800000u);  // inf * -inf
    EXPECT_EQ(bits(out[5]), 0x80000000u);  // -0 * 0
    EXPECT_EQ(bits(out[8]), 0x7FC00000u);  // 0 * inf
    reduceFn(DataType::kFloat32, ReduceOp::kMin)(out.data(), a.data(), b.data(), a.size());
    const uint32_t minWant[] = {0xFF800000, 0xFF800000,  0x3F800000, 0x7FC00000, 0x7FC00000,
                                0x80000000, bits(3e38f), 0x7FC00000, 0x00000000};
    for (size_t i = 0; i < a.size(); ++i) EXPECT_EQ(bits(out[i]), minWant[i]) << "min " << i;
    reduceFn(DataType::kFloat32, ReduceOp::kMax)(out.data(), a.data(), b.data(), a.size());
    EXPECT_EQ(bits(out[3]), 0x7FC00000u);
    EXPECT_EQ(bits(out[5]), 0x00000000u);  // max(-0, +0) = +0
    EXPECT_EQ(bits(out[8]), 0x7F800000u);
  }
}

// ---- conversions -------------------------------------------------------------------

// Floats that stress the rounding to a 16-bit format: every representable value,
// every midpoint between neighbours (ties), one float ulp either side of each
// midpoint, hand-picked edges and random bit patterns.
std::vector<float> conversionInputs(Format f, std::mt19937_64& rng) {
  std::vector<float> v;
  for (uint32_t h = 0; h < 0x10000; ++h) {
    const double x = decode16(static_cast<uint16_t>(h), f);
    v.push_back(static_cast<float>(x));
    const double next = decode16(static_cast<uint16_t>(h + 1), f);
    if (h == 0x7FFF || h == 0xFFFF || std::isnan(x) || std::isnan(next) || std::isinf(x)) continue;
    const auto mid = static_cast<float>((x + next) / 2);  // exact: one more bit than f has
    v.push_back(mid);
    v.push_back(std::nextafter(mid, 0.0f));
    v.push_back(std::nextafter(mid, std::numeric_limits<float>::infinity()));
    v.push_back(std::nextafter(mid, -std::numeric_limits<float>::infinity()));
  }
  const uint32_t edges[] = {0x33000000, 0x33000001, 0x32FFFFFF, 0x33800000, 0x387FC000, 0x387FE000,
                            0x387FFFFF, 0x38800000, 0x477FE000, 0x477FEFFF, 0x477FF000, 0x477FFFFF,
                            0x47800000, 0x7F7FFFFF, 0x7F7F7FFF, 0x7F7F8000, 0x00000001, 0x007FFFFF,
                            0x00800000, 0x7F800000, 0x7F800001, 0x7FBFFFFF, 0x7FC00000, 0x7FFFFFFF,
                            0x7FC01000, 0x7F802000, 0x7FFFE000, 0x7F80FFFF};
  for (uint32_t e : edges) {
    v.push_back(floatOf(e));
    v.push_back(floatOf(e | 0x80000000u));
  }
  for (int i = 0; i < 1000000; ++i) v.push_back(floatOf(static_cast<uint32_t>(rng())));
  return v;
}

TEST(Conversion, HalfToFloatExhaustive) {
  std::vector<uint16_t> all(0x10000);
  for (uint32_t h = 0; h < 0x10000; ++h) all[h] = static_cast<uint16_t>(h);
  for (uint32_t h = 0; h < 0x10000; ++h) {
    const float got = halfToFloat(all[h]);
    if (isNan16(all[h], kHalf)) {
      // Sign and payload kept, made quiet (as VCVTPH2PS does).
      const uint32_t want = ((h & 0x8000u) << 16) | 0x7FC00000u | ((h & 0x3FFu) << 13);
      ASSERT_EQ(bits(got), want) << std::hex << h;
    } else {
      ASSERT_EQ(bits(got), bits(static_cast<float>(decode16(all[h], kHalf)))) << std::hex << h;
    }
  }
  // Each SIMD table (F16C in hardware) agrees bit for bit with the scalar path.
  for (Isa isa : kAllIsas) {
    const cpu::KernelTable* table = cpu::tableFor(isa);
    if (table == nullptr) continue;
    std::vector<float> out(all.size() + 1);
    table->halfToFloat(out.data() + 1, all.data(), all.size());  // misaligned dst
    for (uint32_t h = 0; h < 0x10000; ++h) {
      ASSERT_EQ(bits(out[h + 1]), bits(halfToFloat(all[h])))
          << toString(isa) << std::hex << " " << h;
    }
  }
}

TEST(Conversion, FloatToHalf) {
  std::mt19937_64 rng(7);
  const std::vector<float> in = conversionInputs(kHalf, rng);
  std::vector<uint16_t> scalar(in.size());
  for (size_t i = 0; i < in.size(); ++i) {
    scalar[i] = floatToHalf(in[i]);
    const uint32_t x = bits(in[i]);
    if (std::isnan(in[i])) {
      const uint32_t want = ((x >> 16) & 0x8000u) | 0x7E00u | ((x >> 13) & 0x3FFu);
      ASSERT_EQ(scalar[i], want) << std::hex << x;
    } else {
      ASSERT_EQ(scalar[i], encode16(in[i], kHalf)) << std::hex << x;
    }
  }
  for (Isa isa : kAllIsas) {
    const cpu::KernelTable* table = cpu::tableFor(isa);
    if (table == nullptr) continue;
    std::vector<uint16_t> out(in.size());
    table->floatToHalf(out.data(), in.data(), in.size());
    for (size_t i = 0; i < in.size(); ++i) {
      ASSERT_EQ(out[i], scalar[i]) << toString(isa) << " input " << std::hex << bits(in[i]);
    }
  }
}

TEST(Conversion, Bfloat16) {
  for (uint32_t b = 0; b < 0x10000; ++b) {
    const auto v = static_cast<uint16_t>(b);
    const float got = bfloat16ToFloat(v);
    ASSERT_EQ(bits(got), b << 16) << std::hex << b;  // exact, NaN payload included
    if (!isNan16(v, kBf16)) {
      ASSERT_EQ(static_cast<double>(got), decode16(v, kBf16)) << std::hex << b;
    }
  }
  std::mt19937_64 rng(8);
  const std::vector<float> in = conversionInputs(kBf16, rng);
  std::vector<uint16_t> scalar(in.size());
  for (size_t i = 0; i < in.size(); ++i) {
    scalar[i] = floatToBfloat16(in[i]);
    const uint32_t x = bits(in[i]);
    if (std::isnan(in[i])) {
      ASSERT_EQ(scalar[i], (x >> 16) | 0x40u) << std::hex << x;  // quiet, payload kept
    } else {
      ASSERT_EQ(scalar[i], encode16(in[i], kBf16)) << std::hex << x;
    }
  }
  // The edges named in the brief.
  EXPECT_EQ(floatToBfloat16(floatOf(0x3F808000)), 0x3F80);  // tie, even stays
  EXPECT_EQ(floatToBfloat16(floatOf(0x3F818000)), 0x3F82);  // tie, odd rounds up
  EXPECT_EQ(floatToBfloat16(floatOf(0x7F7FFFFF)), 0x7F80);  // overflow to inf
  EXPECT_EQ(floatToBfloat16(floatOf(0xFF7F8000)), 0xFF80);  // tie at the top rounds to -inf
  EXPECT_EQ(floatToBfloat16(floatOf(0x7F800001)), 0x7FC0);  // sNaN becomes quiet, not inf
  EXPECT_EQ(floatToBfloat16(floatOf(0xFF80FFFF)), 0xFFC0);
  EXPECT_EQ(floatToBfloat16(floatOf(0x00008000)), 0x0000);  // subnormal tie to even
  EXPECT_EQ(floatToBfloat16(floatOf(0x00018000)), 0x0002);
  for (Isa isa : kAllIsas) {
    const cpu::KernelTable* table = cpu::tableFor(isa);
    if (table == nullptr) continue;
    std::vector<uint16_t> out(in.size());
    table->floatToBfloat16(out.data(), in.data(), in.size());
    for (size_t i = 0; i < in.size(); ++i) {
      ASSERT_EQ(out[i], scalar[i]) << toString(isa) << " input " << std::hex << bits(in[i]);
    }
    std::vector<float> wide(in.size());
    table->bfloat16ToFloat(wide.data(), out.data(), out.size());
    for (size_t i = 0; i < in.size(); ++i) ASSERT_EQ(bits(wide[i]), uint32_t{out[i]} << 16);
  }
}

// Every float8 code widens to the reference value (NaN to NaN with its sign);
// narrowing every float32 near each code, the midpoints between codes, the
// overflow boundary and random bit patterns gives the reference's code.
TEST(Conversion, Float8BothFormats) {
  std::mt19937_64 rng(8);
  for (DataType t : {DataType::kFloat8E4M3, DataType::kFloat8E5M2}) {
    const Format8 f = format8(t);
    auto widen = [t](uint8_t b) {
      return t == DataType::kFloat8E4M3 ? float8e4m3ToFloat(b) : float8e5m2ToFloat(b);
    };
    auto narrow = [t](float x) {
      return t == DataType::kFloat8E4M3 ? floatToFloat8e4m3(x) : floatToFloat8e5m2(x);
    };
    for (int c = 0; c < 256; ++c) {
      const auto b = static_cast<uint8_t>(c);
      const double want = decode8(b, f);
      const float got = widen(b);
      if (std::isnan(want)) {
        ASSERT_TRUE(std::isnan(got)) << gflow::toString(t) << " code " << c;
        ASSERT_EQ(std::signbit(got), (c & 0x80) != 0) << c;
      } else {
        ASSERT_EQ(static_cast<double>(got), want) << gflow::toString(t) << " code " << c;
        ASSERT_EQ(std::signbit(got), std::signbit(want)) << c;
      }
    }
    std::vector<float> probes = {0.0f,
                                 -0.0f,
                                 std::numeric_limits<float>::infinity(),
                                 -std::numeric_limits<float>::infinity(),
                                 1e-30f,
                                 -1e-30f,
                                 1e30f,
                                 464.0f,
                                 480.0f,
                                 61440.0f,
                                 57344.0f,
                                 65536.0f};
    for (int c = 0; c < 0x7F; ++c) {
      const double lo = magnitude8(static_cast<uint8_t>(c), f);
      const double hi = magnitude8(static_cast<uint8_t>(c + 1), f);
      for (double x : {lo, (lo + hi) / 2, std::nextafter((lo + hi) / 2, 0.0),
                       std::nextafter((lo + hi) / 2, 1e9)}) {
        probes.push_back(static_cast<float>(x));
        probes.push_back(-static_cast<float>(x));
      }
    }
    for (int i = 0; i < 100000; ++i) probes.push_back(floatOf(static_cast<uint32_t>(rng())));
    for (float x : probes) {
      const uint8_t got = narrow(x), want = encode8(static_cast<double>(x), f);
      if (std::isnan(x)) {
        ASSERT_EQ(got & 0x7F, f.nan()) << gflow::toString(t) << " NaN " << bits(x);
        ASSERT_EQ(got & 0x80, std::signbit(x) ? 0x80 : 0) << bits(x);
      } else {
        ASSERT_EQ(got, want) << gflow::toString(t) << " " << x << " (0x" << std::hex << bits(x)
                             << ")";
      }
    }
  }
}

// ---- divide -------------------------------------------------------------------------

// One element of data / divisor, independently: float types divide in double
// and round (harmless double rounding), NaN comes back quiet with its payload.
void refDivide(DataType dtype, const uint8_t* in, uint8_t* out, int64_t d) {
  switch (dtype) {
    case DataType::kFloat32: {
      const float x = load<float>(in);
      const double q = static_cast<double>(x) / static_cast<double>(static_cast<float>(d));
      put<uint32_t>(out, std::isnan(x) ? bits(x) | 0x400000u : bits(static_cast<float>(q)));
      return;
    }
    case DataType::kFloat64: {
      const double x = load<double>(in);
      put<uint64_t>(
          out, std::isnan(x) ? bits(x) | (uint64_t{1} << 51) : bits(x / static_cast<double>(d)));
      return;
    }
    case DataType::kFloat16:
    case DataType::kBFloat16: {
      const Format f = dtype == DataType::kFloat16 ? kHalf : kBf16;
      const uint16_t x = load<uint16_t>(in);
      put<uint16_t>(out, isNan16(x, f) ? static_cast<uint16_t>(x | f.quietBit())
                                       : encode16(decode16(x, f) / static_cast<double>(d), f));
      return;
    }
    // Truncation toward zero, on magnitudes.
    case DataType::kInt32:
    case DataType::kInt64: {
      const __int128 x = dtype == DataType::kInt32 ? load<int32_t>(in) : load<int64_t>(in);
      const __int128 q = (x < 0 ? -((-x) / d) : x / d);
      if (dtype == DataType::kInt32)
        put(out, static_cast<int32_t>(q));
      else
        put(out, static_cast<int64_t>(q));
      return;
    }
    case DataType::kUInt8: put(out, static_cast<uint8_t>(load<uint8_t>(in) / d)); return;
    case DataType::kInt8:
    case DataType::kInt16: {
      const int64_t x = dtype == DataType::kInt8 ? load<int8_t>(in) : load<int16_t>(in);
      const int64_t q = x < 0 ? -((-x) / d) : x / d;
      if (dtype == DataType::kInt8)
        put(out, static_cast<int8_t>(q));
      else
        put(out, static_cast<int16_t>(q));
      return;
    }
    case DataType::kFloat8E4M3:
    case DataType::kFloat8E5M2: {  // a NaN stays NaN with its sign
      const Format8 f = format8(dtype);
      const uint8_t x = *in;
      *out = isNan8(x, f) ? static_cast<uint8_t>((x & 0x80) | f.nan())
                          : encode8(decode8(x, f) / static_cast<double>(d), f);
      return;
    }
    case DataType::kComplex64:
    case DataType::kComplex128: {
      const DataType part = dtype == DataType::kComplex64 ? DataType::kFloat32 : DataType::kFloat64;
      const size_t half = dataTypeSize(part);
      refDivide(part, in, out, d);
      refDivide(part, in + half, out + half, d);
      return;
    }
    case DataType::kQInt8:
    case DataType::kQInt4: {  // each value in float32, quantized again
      std::vector<float> y = refDequant(dtype, in);
      for (float& v : y) v = v / static_cast<float>(d);
      refQuant(dtype, y, out);
      return;
    }
    case DataType::kBool: return;  // divide refuses bool (Divide.RejectsBadArguments)
  }
}

TEST(Divide, MatchesReference) {
  IsaGuard guard;
  std::mt19937_64 rng(5);
  for (Isa isa : kAllIsas) {
    if (!setIsa(isa)) continue;
    for (DataType dtype : kAllTypes) {
      if (dtype == DataType::kBool) continue;  // avg does not apply
      const size_t size = dataTypeSize(dtype);
      for (int64_t d :
           {int64_t{1}, int64_t{2}, int64_t{3}, int64_t{7}, int64_t{1000}, int64_t{1} << 40}) {
        for (size_t count : {size_t{0}, size_t{1}, size_t{17}, size_t{5003}}) {
          std::vector<uint8_t> buf(count * size + 1);
          uint8_t* data = buf.data() + 1;  // misaligned
          fillRandom(dtype, data, count, rng);
          std::vector<uint8_t> want(count * size + 1);
          for (size_t i = 0; i < count; ++i)
            refDivide(dtype, data + i * size, want.data() + i * size, d);
          divide(data, count, dtype, d);
          for (size_t i = 0; i < count; ++i) {
            ASSERT_EQ(std::memcmp(data + i * size, want.data() + i * size, size), 0)
                << toString(isa) << " " << gflow::toString(dtype) << " / " << d << " element " << i
                << " got " << hexBytes(data + i * size, size) << " want "
                << hexBytes(want.data() + i * size, size);
          }
        }
      }
    }
  }
}

TEST(Divide, TruncatesTowardZero) {
  std::vector<int32_t> v = {-7, 7, -1, INT32_MIN, INT32_MAX};
  divide(v.data(), v.size(), DataType::kInt32, 2);
  EXPECT_EQ(v, (std::vector<int32_t>{-3, 3, 0, INT32_MIN / 2, INT32_MAX / 2}));
  std::vector<int64_t> w = {INT64_MIN, -5};
  divide(w.data(), w.size(), DataType::kInt64, 4);
  EXPECT_EQ(w, (std::vector<int64_t>{INT64_MIN / 4, -1}));
}

TEST(Divide, RejectsBadArguments) {
  float x = 1.0f;
  for (int64_t d : {int64_t{0}, int64_t{-2}}) {
    try {
      divide(&x, 1, DataType::kFloat32, d);
      ADD_FAILURE() << "divisor " << d << " accepted";
    } catch (const Error& e) {
      EXPECT_EQ(e.code(), ErrorCode::kInvalidArgument);
    }
  }
  EXPECT_THROW(divide(&x, 1, static_cast<DataType>(42), 2), Error);
  bool flag = true;
  EXPECT_THROW(divide(&flag, 1, DataType::kBool, 2), Error);
  divide(nullptr, 0, DataType::kFloat16, 3);  // nothing to do, nothing touched
}

// ---- dispatch -----------------------------------------------------------------------

TEST(Dispatch, InvalidEnumsThrow) {
  for (auto [dtype, op] : {std::pair{static_cast<DataType>(kNumDataTypes), ReduceOp::kSum},
                           std::pair{DataType::kFloat32, static_cast<ReduceOp>(kNumReduceOps)},
                           std::pair{static_cast<DataType>(255), static_cast<ReduceOp>(255)}}) {
    try {
      reduceFn(dtype, op);
      ADD_FAILURE() << "invalid enum accepted";
    } catch (const Error& e) {
      EXPECT_EQ(e.code(), ErrorCode::kInvalidArgument);
    }
  }
}

TEST(Dispatch, AvgUsesSumAndEveryEntryIsSet) {
  for (DataType dtype : kAllTypes) {
    for (ReduceOp op : kAllOps) {
      if (supportsReduceOp(dtype, op)) {
        EXPECT_NE(reduceFn(dtype, op), nullptr);
      }
    }
    if (dtype == DataType::kBool) continue;
    EXPECT_EQ(reduceFn(dtype, ReduceOp::kAvg), reduceFn(dtype, ReduceOp::kSum));
  }
}

// The pairs supportsReduceOp refuses have no kernel: invalid_argument naming
// both, never a null function.
TEST(Dispatch, OpsThatDoNotApplyToTheTypeThrow) {
  int refused = 0;
  for (DataType dtype : kAllTypes) {
    for (ReduceOp op : kAllOps) {
      if (supportsReduceOp(dtype, op)) continue;
      ++refused;
      try {
        reduceFn(dtype, op);
        ADD_FAILURE() << gflow::toString(dtype) << " " << gflow::toString(op) << " accepted";
      } catch (const Error& e) {
        EXPECT_EQ(e.code(), ErrorCode::kInvalidArgument);
        EXPECT_NE(std::string(e.what()).find(gflow::toString(dtype)), std::string::npos);
        EXPECT_NE(std::string(e.what()).find(gflow::toString(op)), std::string::npos);
      }
    }
  }
  // The floats refuse the 3 bitwise ops (6 types), complex all but sum and
  // avg (2 x 6), the quantized types prod and the bitwise ops (2 x 4), bool
  // avg.
  EXPECT_EQ(refused, 6 * 3 + 2 * 6 + 2 * 4 + 1);
}

TEST(Dispatch, IsaSelection) {
  IsaGuard guard;
  EXPECT_STREQ(toString(Isa::kBaseline), "baseline");
  EXPECT_STREQ(toString(Isa::kAvx2), "avx2");
  EXPECT_STREQ(toString(Isa::kAvx512), "avx512");
  const Isa best = detectedIsa();
  EXPECT_EQ(cpu::tableFor(best)->isa, best);
  EXPECT_TRUE(setIsa(Isa::kBaseline));
  EXPECT_EQ(activeIsa(), Isa::kBaseline);
  EXPECT_EQ(reduceFn(DataType::kFloat32, ReduceOp::kSum), cpu::baselineTable().reduce[0][0]);
  for (Isa isa : kAllIsas) {
    const bool supported = static_cast<int>(isa) <= static_cast<int>(best);
    EXPECT_EQ(setIsa(isa), supported) << toString(isa);
    EXPECT_EQ(activeIsa(), supported ? isa : Isa::kBaseline) << toString(isa);
    setIsa(Isa::kBaseline);
  }
  EXPECT_FALSE(setIsa(static_cast<Isa>(9)));
  EXPECT_EQ(activeIsa(), Isa::kBaseline);
}

}  // namespace
}  // namespace gflow::kernels
