#include "common/pattern.h"

#include <algorithm>
#include <cmath>
#include <cstring>

namespace gflow::bench {
namespace {

constexpr int kMinMaxRange = 120;  // min/max values are 1..120

// Round to nearest even, as the hardware and gflow's kernels do. Inputs here
// are finite and small, but the edge cases are handled anyway.
uint16_t floatToHalf(float f) {
  uint32_t x;
  std::memcpy(&x, &f, sizeof(x));
  uint16_t sign = static_cast<uint16_t>((x >> 16) & 0x8000u);
  uint32_t a = x & 0x7fffffffu;
  if (a >= 0x7f800000u) return sign | (a > 0x7f800000u ? 0x7e00 : 0x7c00);  // NaN, inf
  if (a >= 0x477ff000u) return sign | 0x7c00;  // >= 65520 rounds to inf
  if (a < 0x38800000u) {
    // Below 2^-14: a subnormal half, in units of 2^-24; scaling by a power of
    // two is exact, and nearbyint rounds to nearest even.
    float af;
    std::memcpy(&af, &a, sizeof(af));
    return sign | static_cast<uint16_t>(std::nearbyint(af * 16777216.0f));
  }
  uint32_t h = ((((a >> 23) - 127 + 15) << 10) | ((a & 0x7fffffu) >> 13));
  uint32_t rest = a & 0x1fffu;
  if (rest > 0x1000u || (rest == 0x1000u && (h & 1u))) ++h;  // a carry bumps the exponent
  return sign | static_cast<uint16_t>(h);
}

uint16_t floatToBFloat16(float f) {
  uint32_t x;
  std::memcpy(&x, &f, sizeof(x));
  if ((x & 0x7fffffffu) > 0x7f800000u) return static_cast<uint16_t>((x >> 16) | 0x40);  // NaN
  x += 0x7fffu + ((x >> 16) & 1u);
  return static_cast<uint16_t>(x >> 16);
}

// Largest integer N such that every integer in [0, N] is exact in the type
// and sums up to N cannot overflow it.
int64_t exactIntegerLimit(DataType t) {
  switch (t) {
    case DataType::kUInt8: return 255;
    case DataType::kInt8: return 127;
    case DataType::kInt16: return 32767;
    case DataType::kBFloat16: return 256;
    case DataType::kFloat16: return 2048;
    case DataType::kFloat32: return 1 << 24;
    default: return 1 << 30;
  }
}

// How many factors of two a product may hold and stay exact (and in range).
int exponentRoom(DataType t) {
  switch (t) {
    case DataType::kUInt8: return 7;
    case DataType::kInt8: return 6;
    case DataType::kInt16: return 14;
    case DataType::kFloat16: return 15;
    case DataType::kInt32: return 30;
    case DataType::kInt64: return 62;
    default: return 100;  // float32, bfloat16 (max 2^127), float64
  }
}

}  // namespace

void encodeValue(DataType dtype, double value, void* dst) {
  switch (dtype) {
    case DataType::kFloat32: {
      float v = static_cast<float>(value);
      std::memcpy(dst, &v, sizeof(v));
      return;
    }
    case DataType::kFloat64: std::memcpy(dst, &value, sizeof(value)); return;
    case DataType::kFloat16: {
      // double -> float -> half equals double -> half: float has more than
      // twice half's precision, so the double rounding is harmless.
      uint16_t v = floatToHalf(static_cast<float>(value));
      std::memcpy(dst, &v, sizeof(v));
      return;
    }
    case DataType::kBFloat16: {
      uint16_t v = floatToBFloat16(static_cast<float>(value));
      std::memcpy(dst, &v, sizeof(v));
      return;
    }
    case DataType::kInt32: {
      int32_t v = static_cast<int32_t>(value);
      std::memcpy(dst, &v, sizeof(v));
      return;
    }
    case DataType::kInt64: {
      int64_t v = static_cast<int64_t>(value);
      std::memcpy(dst, &v, sizeof(v));
      return;
    }
    case DataType::kUInt8: *static_cast<uint8_t*>(dst) = static_cast<uint8_t>(value); return;
    case DataType::kInt8: *static_cast<int8_t*>(dst) = static_cast<int8_t>(value); return;
    case DataType::kInt16: {
      int16_t v = static_cast<int16_t>(value);
      std::memcpy(dst, &v, sizeof(v));
      return;
    }
    case DataType::kBool:
    case DataType::kFloat8E4M3:
    case DataType::kFloat8E5M2:
    case DataType::kComplex64:
    case DataType::kComplex128:
    case DataType::kQInt8:
    case DataType::kQInt4: break;  // not swept (sweepable() is false)
  }
}

bool sweepable(DataType dtype) {
  switch (dtype) {
    case DataType::kBool:
    case DataType::kFloat8E4M3:
    case DataType::kFloat8E5M2:
    case DataType::kComplex64:
    case DataType::kComplex128:
    case DataType::kQInt8:
    case DataType::kQInt4: return false;
    default: return true;
  }
}

void fillValue(DataType dtype, double value, void* buf, size_t count) {
  size_t esize = dataTypeSize(dtype);
  uint8_t one[8];
  encodeValue(dtype, value, one);
  auto* dst = static_cast<uint8_t*>(buf);
  for (size_t i = 0; i < count; ++i) std::memcpy(dst + i * esize, one, esize);
}

CheckPattern::CheckPattern(DataType dtype, ReduceOp op, int worldSize)
    : dtype_(dtype), op_(op), esize_(dataTypeSize(dtype)) {
  int64_t limit = exactIntegerLimit(dtype);
  sumMax_ = static_cast<int>(std::clamp<int64_t>(limit / worldSize, 1, 8));
  prodMax_ = exponentRoom(dtype);
  switch (op) {
    case ReduceOp::kSum:
    case ReduceOp::kAvg: period_ = static_cast<size_t>(sumMax_); break;
    case ReduceOp::kMin:
    case ReduceOp::kMax:
    case ReduceOp::kBand:
    case ReduceOp::kBor:
    case ReduceOp::kBxor: period_ = kMinMaxRange; break;
    case ReduceOp::kProd: period_ = static_cast<size_t>(worldSize) + 1; break;
  }

  expected_.resize(period_ * esize_);
  for (size_t j = 0; j < period_; ++j) {
    double acc = value(0, j);
    for (int r = 1; r < worldSize; ++r) {
      double v = value(r, j);
      switch (op) {
        case ReduceOp::kSum:
        case ReduceOp::kAvg: acc += v; break;
        case ReduceOp::kMin: acc = std::min(acc, v); break;
        case ReduceOp::kMax: acc = std::max(acc, v); break;
        case ReduceOp::kProd: acc *= v; break;
        case ReduceOp::kBand: acc = static_cast<double>(int64_t(acc) & int64_t(v)); break;
        case ReduceOp::kBor: acc = static_cast<double>(int64_t(acc) | int64_t(v)); break;
        case ReduceOp::kBxor: acc = static_cast<double>(int64_t(acc) ^ int64_t(v)); break;
      }
    }
    if (op == ReduceOp::kAvg) {
      bool integer = dtype == DataType::kInt32 || dtype == DataType::kInt64 ||
                     dtype == DataType::kUInt8 || dtype == DataType::kInt8 ||
                     dtype == DataType::kInt16;
      acc = integer ? std::trunc(acc / worldSize) : acc / worldSize;
    }
    encodeValue(dtype, acc, &expected_[j * esize_]);
  }
}

double CheckPattern::value(int rank, size_t j) const {
  switch (op_) {
    case ReduceOp::kSum:
    case ReduceOp::kAvg: return 1 + static_cast<double>((static_cast<size_t>(rank) + j) % period_);
    case ReduceOp::kMin:
    case ReduceOp::kMax:
    case ReduceOp::kBand:
    case ReduceOp::kBor:
    case ReduceOp::kBxor:
      return 1 + static_cast<double>((static_cast<size_t>(rank) * 7 + j * 3) % kMinMaxRange);
    case ReduceOp::kProd:
      // Element j gets a 2 from ranks 0..j-1 (at most prodMax_ of them):
      // products range over 1..2^min(size, prodMax_) across the period.
      return (static_cast<size_t>(rank) < j && rank < prodMax_) ? 2 : 1;
  }
  return 0;
}

void CheckPattern::fillInput(int rank, void* buf, size_t count) const {
  std::vector<uint8_t> block(period_ * esize_);
  for (size_t j = 0; j < period_; ++j) encodeValue(dtype_, value(rank, j), &block[j * esize_]);
  auto* dst = static_cast<uint8_t*>(buf);
  for (size_t i = 0; i < count; i += period_) {
    size_t n = std::min(period_, count - i);
    std::memcpy(dst + i * esize_, block.data(), n * esize_);
  }
}

int64_t CheckPattern::countWrong(const void* result, size_t count, size_t offset) const {
  const auto* got = static_cast<const uint8_t*>(result);
  int64_t wrong = 0;
  if (offset % period_ != 0) {  // element by element (reduce-scatter blocks)
    for (size_t j = 0; j < count; ++j) {
      const size_t e = (offset + j) % period_;
      if (std::memcmp(got + j * esize_, &expected_[e * esize_], esize_) != 0) ++wrong;
    }
    return wrong;
  }
  for (size_t i = 0; i < count; i += period_) {
    size_t n = std::min(period_, count - i);
    const uint8_t* block = got + i * esize_;
    if (std::memcmp(block, expected_.data(), n * esize_) == 0) continue;  // the common case
    for (size_t j = 0; j < n; ++j) {
      if (std::memcmp(block + j * esize_, &expected_[j * esize_], esize_) != 0) ++wrong;
    }
  }
  return wrong;
}

}  // namespace gflow::bench
