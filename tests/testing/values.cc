#include "testing/values.h"

#include <cmath>
#include <cstring>

#include "kernels/reduce.h"

namespace gflow::testing {

double getValue(const void* buf, size_t i, DataType t) {
  switch (t) {
    case DataType::kFloat32: return static_cast<const float*>(buf)[i];
    case DataType::kFloat64: return static_cast<const double*>(buf)[i];
    case DataType::kFloat16: return kernels::halfToFloat(static_cast<const uint16_t*>(buf)[i]);
    case DataType::kBFloat16: return kernels::bfloat16ToFloat(static_cast<const uint16_t*>(buf)[i]);
    case DataType::kInt32: return static_cast<const int32_t*>(buf)[i];
    case DataType::kInt64: return static_cast<double>(static_cast<const int64_t*>(buf)[i]);
    case DataType::kUInt8: return static_cast<const uint8_t*>(buf)[i];
  }
  return 0;
}

void setValue(void* buf, size_t i, DataType t, double v) {
  switch (t) {
    case DataType::kFloat32: static_cast<float*>(buf)[i] = static_cast<float>(v); break;
    case DataType::kFloat64: static_cast<double*>(buf)[i] = v; break;
    case DataType::kFloat16:
      static_cast<uint16_t*>(buf)[i] = kernels::floatToHalf(static_cast<float>(v));
      break;
    case DataType::kBFloat16:
      static_cast<uint16_t*>(buf)[i] = kernels::floatToBfloat16(static_cast<float>(v));
      break;
    case DataType::kInt32: static_cast<int32_t*>(buf)[i] = static_cast<int32_t>(v); break;
    case DataType::kInt64: static_cast<int64_t*>(buf)[i] = static_cast<int64_t>(v); break;
    case DataType::kUInt8:
      static_cast<uint8_t*>(buf)[i] = static_cast<uint8_t>(static_cast<int64_t>(v) & 0xff);
      break;
  }
}

double roundTo(DataType t, double v) {
  std::vector<char> tmp(8);
  setValue(tmp.data(), 0, t, v);
  return getValue(tmp.data(), 0, t);
}

double exactInput(int rank, size_t i, ReduceOp op, DataType t) {
  const uint64_t h = (static_cast<uint64_t>(rank) * 7919u + i * 104729u + 13) % 1000003u;
  const bool isUnsigned = (t == DataType::kUInt8);
  switch (op) {
    case ReduceOp::kProd: {
      // Powers of two (and -1) keep products exact in every float format.
      static const double signedSet[] = {1, 2, -1, 1};
      static const double unsignedSet[] = {1, 2, 1, 1};
      return isUnsigned ? unsignedSet[h % 4] : signedSet[h % 4];
    }
    case ReduceOp::kMin:
    case ReduceOp::kMax:
      return isUnsigned ? static_cast<double>(h % 200) : static_cast<double>(h % 200) - 100;
    case ReduceOp::kSum:
    case ReduceOp::kAvg:
      return isUnsigned ? static_cast<double>(h % 4) : static_cast<double>(h % 9) - 4;
  }
  return 0;
}

double exactExpected(int n, size_t i, ReduceOp op, DataType t) {
  double acc = exactInput(0, i, op, t);
  for (int r = 1; r < n; ++r) {
    double v = exactInput(r, i, op, t);
    switch (op) {
      case ReduceOp::kSum:
      case ReduceOp::kAvg: acc += v; break;
      case ReduceOp::kProd: acc *= v; break;
      case ReduceOp::kMin: acc = std::min(acc, v); break;
      case ReduceOp::kMax: acc = std::max(acc, v); break;
    }
  }
  if (t == DataType::kUInt8) acc = static_cast<double>(static_cast<int64_t>(acc) & 0xff);
  if (op == ReduceOp::kAvg) {
    if (t == DataType::kInt32 || t == DataType::kInt64 || t == DataType::kUInt8) {
      acc = std::trunc(acc / n);
    } else {
      acc = roundTo(t, acc / n);
    }
  }
  return acc;
}

const std::vector<DataType>& allDataTypes() {
  static const std::vector<DataType> v = {
      DataType::kFloat32, DataType::kFloat16, DataType::kBFloat16, DataType::kFloat64,
      DataType::kInt32,   DataType::kInt64,   DataType::kUInt8};
  return v;
}

const std::vector<ReduceOp>& allReduceOps() {
  static const std::vector<ReduceOp> v = {ReduceOp::kSum, ReduceOp::kAvg, ReduceOp::kMin,
                                          ReduceOp::kMax, ReduceOp::kProd};
  return v;
}

}  // namespace gflow::testing
