#include "testing/values.h"

#include <algorithm>
#include <cmath>
#include <cstring>

#include "kernels/convert.h"
#include "kernels/reduce.h"

namespace gflow::testing {

namespace {

// Integers wrap like the kernels (two's complement in the type's width).
double wrapInteger(DataType t, double v) {
  const auto x = static_cast<int64_t>(v);
  switch (t) {
    case DataType::kUInt8: return static_cast<double>(x & 0xff);
    case DataType::kInt8: return static_cast<double>(static_cast<int8_t>(x & 0xff));
    case DataType::kInt16: return static_cast<double>(static_cast<int16_t>(x & 0xffff));
    case DataType::kInt32: return static_cast<double>(static_cast<int32_t>(x & 0xffffffff));
    default: return v;
  }
}

bool isInteger(DataType t) {
  return t == DataType::kInt8 || t == DataType::kInt16 || t == DataType::kInt32 ||
         t == DataType::kInt64 || t == DataType::kUInt8;
}

template <class T>
T at(const void* buf, size_t i) {
  T v;
  std::memcpy(&v, static_cast<const char*>(buf) + i * sizeof(T), sizeof v);
  return v;
}

template <class T>
void put(void* buf, size_t i, T v) {
  std::memcpy(static_cast<char*>(buf) + i * sizeof(T), &v, sizeof v);
}

// A complex element holds (v, -v): negation commutes with rounding, so every
// result keeps the imaginary part the negated real part; one that does not
// reads as NaN, which no expected value equals.
template <class F>
double complexValue(const void* buf, size_t i) {
  const F re = at<F>(buf, 2 * i), im = at<F>(buf, 2 * i + 1);
  return im == -re ? static_cast<double>(re) : std::nan("");
}

}  // namespace

double getValue(const void* buf, size_t i, DataType t) {
  switch (t) {
    case DataType::kFloat32: return at<float>(buf, i);
    case DataType::kFloat64: return at<double>(buf, i);
    case DataType::kFloat16: return kernels::halfToFloat(at<uint16_t>(buf, i));
    case DataType::kBFloat16: return kernels::bfloat16ToFloat(at<uint16_t>(buf, i));
    case DataType::kInt32: return at<int32_t>(buf, i);
    case DataType::kInt64: return static_cast<double>(at<int64_t>(buf, i));
    case DataType::kUInt8: return at<uint8_t>(buf, i);
    case DataType::kInt8: return at<int8_t>(buf, i);
    case DataType::kInt16: return at<int16_t>(buf, i);
    case DataType::kBool: return at<uint8_t>(buf, i);  // a result must be 0 or 1 exactly
    case DataType::kFloat8E4M3: return kernels::float8e4m3ToFloat(at<uint8_t>(buf, i));
    case DataType::kFloat8E5M2: return kernels::float8e5m2ToFloat(at<uint8_t>(buf, i));
    case DataType::kComplex64: return complexValue<float>(buf, i);
    case DataType::kComplex128: return complexValue<double>(buf, i);
    case DataType::kQInt8:
    case DataType::kQInt4: {  // the block's first value
      float f[kQuantBlock];
      kernels::widen(f, static_cast<const char*>(buf) + i * dataTypeSize(t), kQuantBlock, t);
      return f[0];
    }
  }
  return 0;
}

void setValue(void* buf, size_t i, DataType t, double v) {
  const auto f = static_cast<float>(v);
  switch (t) {
    case DataType::kFloat32: return put<float>(buf, i, f);
    case DataType::kFloat64: return put<double>(buf, i, v);
    case DataType::kFloat16: return put<uint16_t>(buf, i, kernels::floatToHalf(f));
    case DataType::kBFloat16: return put<uint16_t>(buf, i, kernels::floatToBfloat16(f));
    case DataType::kInt32: return put<int32_t>(buf, i, static_cast<int32_t>(wrapInteger(t, v)));
    case DataType::kInt64: return put<int64_t>(buf, i, static_cast<int64_t>(v));
    case DataType::kUInt8: return put<uint8_t>(buf, i, static_cast<uint8_t>(wrapInteger(t, v)));
    case DataType::kInt8: return put<int8_t>(buf, i, static_cast<int8_t>(wrapInteger(t, v)));
    case DataType::kInt16: return put<int16_t>(buf, i, static_cast<int16_t>(wrapInteger(t, v)));
    case DataType::kBool: return put<uint8_t>(buf, i, v != 0 ? 1 : 0);
    case DataType::kFloat8E4M3: return put<uint8_t>(buf, i, kernels::floatToFloat8e4m3(f));
    case DataType::kFloat8E5M2: return put<uint8_t>(buf, i, kernels::floatToFloat8e5m2(f));
    case DataType::kComplex64: put<float>(buf, 2 * i, f); return put<float>(buf, 2 * i + 1, -f);
    case DataType::kComplex128: put<double>(buf, 2 * i, v); return put<double>(buf, 2 * i + 1, -v);
    case DataType::kQInt8:
    case DataType::kQInt4: {  // a block of kQuantBlock values v
      float x[kQuantBlock];
      std::fill(x, x + kQuantBlock, f);
      return kernels::narrow(static_cast<char*>(buf) + i * dataTypeSize(t), x, kQuantBlock, t);
    }
  }
}

double roundTo(DataType t, double v) {
  std::vector<char> tmp(16);
  setValue(tmp.data(), 0, t, v);
  return getValue(tmp.data(), 0, t);
}

double exactInput(int rank, size_t i, ReduceOp op, DataType t) {
  const uint64_t h = (static_cast<uint64_t>(rank) * 7919u + i * 104729u + 13) % 1000003u;
  const bool isUnsigned = (t == DataType::kUInt8);
  // float8 holds the integers up to 8 exactly (E5M2; E4M3 up to 16): sums of
  // -1, 0 and 1 over 8 ranks stay exact at every partial sum.
  const bool isFloat8 = t == DataType::kFloat8E4M3 || t == DataType::kFloat8E5M2;
  if (t == DataType::kBool) {
    // Mostly true where "and" reduces, mostly false where "or" does.
    const bool andLike = op == ReduceOp::kProd || op == ReduceOp::kMin || op == ReduceOp::kBand;
    return op == ReduceOp::kBxor ? static_cast<double>(h % 2)
           : andLike             ? static_cast<double>(h % 8 != 0)
                                 : static_cast<double>(h % 8 == 0);
  }
  switch (op) {
    case ReduceOp::kProd: {
      // Powers of two (and -1) keep products exact in every float format.
      static const double signedSet[] = {1, 2, -1, 1};
      static const double unsignedSet[] = {1, 2, 1, 1};
      return isUnsigned ? unsignedSet[h % 4] : signedSet[h % 4];
    }
    case ReduceOp::kMin:
    case ReduceOp::kMax:
      if (isFloat8) return static_cast<double>(h % 17) - 8;
      return isUnsigned ? static_cast<double>(h % 200) : static_cast<double>(h % 200) - 100;
    case ReduceOp::kSum:
    case ReduceOp::kAvg:
      if (isFloat8) return static_cast<double>(h % 3) - 1;
      return isUnsigned ? static_cast<double>(h % 4) : static_cast<double>(h % 9) - 4;
    case ReduceOp::kBand:
    case ReduceOp::kBor:
    case ReduceOp::kBxor: return static_cast<double>(h % 128);  // every integer type holds it
  }
  return 0;
}

double exactExpected(int n, size_t i, ReduceOp op, DataType t) {
  double acc = exactInput(0, i, op, t);
  auto bits = [](double x) { return static_cast<int64_t>(x); };
  for (int r = 1; r < n; ++r) {
    double v = exactInput(r, i, op, t);
    switch (op) {
      case ReduceOp::kSum:
      case ReduceOp::kAvg: acc += v; break;
      case ReduceOp::kProd: acc *= v; break;
      case ReduceOp::kMin: acc = std::min(acc, v); break;
      case ReduceOp::kMax: acc = std::max(acc, v); break;
      case ReduceOp::kBand: acc = static_cast<double>(bits(acc) & bits(v)); break;
      case ReduceOp::kBor: acc = static_cast<double>(bits(acc) | bits(v)); break;
      case ReduceOp::kBxor: acc = static_cast<double>(bits(acc) ^ bits(v)); break;
    }
  }
  // bool: sum is "or" and prod "and", of inputs that are 0 or 1.
  if (t == DataType::kBool) return acc != 0 ? 1 : 0;
  acc = wrapInteger(t, acc);
  if (op == ReduceOp::kAvg) {
    acc = isInteger(t) ? std::trunc(acc / n) : roundTo(t, acc / n);
  }
  return acc;
}

const std::vector<DataType>& allDataTypes() {
  static const std::vector<DataType> v = [] {
    std::vector<DataType> all;
    for (int t = 0; t < kNumDataTypes; ++t) {
      if (!isQuantized(static_cast<DataType>(t))) all.push_back(static_cast<DataType>(t));
    }
    return all;
  }();
  return v;
}

const std::vector<ReduceOp>& allReduceOps() {
  static const std::vector<ReduceOp> v = [] {
    std::vector<ReduceOp> all;
    for (int op = 0; op < kNumReduceOps; ++op) all.push_back(static_cast<ReduceOp>(op));
    return all;
  }();
  return v;
}

}  // namespace gflow::testing
