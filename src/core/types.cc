#include "gflow/types.h"

#include <algorithm>
#include <cctype>

#include "common/check.h"

namespace gflow {

Tensor tensor(float* data, size_t count) {
  return Tensor(data, count, DataType::kFloat32);
}
Tensor tensor(double* data, size_t count) {
  return Tensor(data, count, DataType::kFloat64);
}
Tensor tensor(int32_t* data, size_t count) {
  return Tensor(data, count, DataType::kInt32);
}
Tensor tensor(int64_t* data, size_t count) {
  return Tensor(data, count, DataType::kInt64);
}
Tensor tensor(uint8_t* data, size_t count) {
  return Tensor(data, count, DataType::kUInt8);
}
Tensor tensor(int8_t* data, size_t count) {
  return Tensor(data, count, DataType::kInt8);
}
Tensor tensor(int16_t* data, size_t count) {
  return Tensor(data, count, DataType::kInt16);
}
Tensor tensor(bool* data, size_t count) {
  static_assert(sizeof(bool) == 1, "gflow's bool is one byte");
  return Tensor(data, count, DataType::kBool);
}

size_t dataTypeSize(DataType dtype) {
  switch (dtype) {
    case DataType::kFloat32: return 4;
    case DataType::kFloat16: return 2;
    case DataType::kBFloat16: return 2;
    case DataType::kFloat64: return 8;
    case DataType::kInt32: return 4;
    case DataType::kInt64: return 8;
    case DataType::kUInt8: return 1;
    case DataType::kInt8: return 1;
    case DataType::kInt16: return 2;
    case DataType::kBool: return 1;
    case DataType::kFloat8E4M3: return 1;
    case DataType::kFloat8E5M2: return 1;
    case DataType::kComplex64: return 8;
    case DataType::kComplex128: return 16;
    case DataType::kQInt8: return sizeof(float) + kQuantBlock;
    case DataType::kQInt4: return sizeof(float) + kQuantBlock / 2;
  }
  return 0;
}

bool isQuantized(DataType dtype) {
  return dtype == DataType::kQInt8 || dtype == DataType::kQInt4;
}

size_t wireElements(DataType wire, size_t count) {
  return isQuantized(wire) ? (count + kQuantBlock - 1) / kQuantBlock : count;
}

const char* toString(DataType dtype) {
  switch (dtype) {
    case DataType::kFloat32: return "float32";
    case DataType::kFloat16: return "float16";
    case DataType::kBFloat16: return "bfloat16";
    case DataType::kFloat64: return "float64";
    case DataType::kInt32: return "int32";
    case DataType::kInt64: return "int64";
    case DataType::kUInt8: return "uint8";
    case DataType::kInt8: return "int8";
    case DataType::kInt16: return "int16";
    case DataType::kBool: return "bool";
    case DataType::kFloat8E4M3: return "float8_e4m3";
    case DataType::kFloat8E5M2: return "float8_e5m2";
    case DataType::kComplex64: return "complex64";
    case DataType::kComplex128: return "complex128";
    case DataType::kQInt8: return "qint8";
    case DataType::kQInt4: return "qint4";
  }
  return "invalid";
}

const char* toString(ReduceOp op) {
  switch (op) {
    case ReduceOp::kSum: return "sum";
    case ReduceOp::kAvg: return "avg";
    case ReduceOp::kMin: return "min";
    case ReduceOp::kMax: return "max";
    case ReduceOp::kProd: return "prod";
    case ReduceOp::kBand: return "band";
    case ReduceOp::kBor: return "bor";
    case ReduceOp::kBxor: return "bxor";
  }
  return "invalid";
}

const char* toString(DeviceType type) {
  switch (type) {
    case DeviceType::kCPU: return "cpu";
    case DeviceType::kCUDA: return "cuda";
  }
  return "invalid";
}

namespace {
std::string lower(std::string s) {
  std::transform(s.begin(), s.end(), s.begin(),
                 [](unsigned char c) { return static_cast<char>(std::tolower(c)); });
  return s;
}
}  // namespace

DataType parseDataType(const std::string& name) {
  const std::string n = lower(name);
  if (n == "float32" || n == "float" || n == "fp32" || n == "f32") return DataType::kFloat32;
  if (n == "float16" || n == "half" || n == "fp16" || n == "f16") return DataType::kFloat16;
  if (n == "bfloat16" || n == "bf16") return DataType::kBFloat16;
  if (n == "float64" || n == "double" || n == "fp64" || n == "f64") return DataType::kFloat64;
  if (n == "int32" || n == "int" || n == "i32") return DataType::kInt32;
  if (n == "int64" || n == "i64") return DataType::kInt64;
  if (n == "uint8" || n == "u8" || n == "byte") return DataType::kUInt8;
  if (n == "int8" || n == "i8" || n == "char") return DataType::kInt8;
  if (n == "int16" || n == "i16" || n == "short") return DataType::kInt16;
  if (n == "bool") return DataType::kBool;
  if (n == "float8_e4m3" || n == "float8_e4m3fn" || n == "e4m3" || n == "fp8_e4m3") {
    return DataType::kFloat8E4M3;
  }
  if (n == "float8_e5m2" || n == "e5m2" || n == "fp8_e5m2") return DataType::kFloat8E5M2;
  if (n == "complex64" || n == "cfloat") return DataType::kComplex64;
  if (n == "complex128" || n == "cdouble") return DataType::kComplex128;
  if (n == "qint8") return DataType::kQInt8;
  if (n == "qint4") return DataType::kQInt4;
  GFLOW_THROW(kInvalidArgument, ErrorContext{})
      << "unknown data type '" << name
      << "' (expected float32, float16, bfloat16, float64, int32, int64, uint8, int8, int16, "
         "bool, float8_e4m3, float8_e5m2, complex64, complex128, qint8 or qint4)";
}

ReduceOp parseReduceOp(const std::string& name) {
  const std::string n = lower(name);
  if (n == "sum") return ReduceOp::kSum;
  if (n == "avg" || n == "mean") return ReduceOp::kAvg;
  if (n == "min") return ReduceOp::kMin;
  if (n == "max") return ReduceOp::kMax;
  if (n == "prod" || n == "product") return ReduceOp::kProd;
  if (n == "band" || n == "and") return ReduceOp::kBand;
  if (n == "bor" || n == "or") return ReduceOp::kBor;
  if (n == "bxor" || n == "xor") return ReduceOp::kBxor;
  GFLOW_THROW(kInvalidArgument, ErrorContext{})
      << "unknown reduce op '" << name
      << "' (expected sum, avg, min, max, prod, band, bor or bxor)";
}

bool supportsReduceOp(DataType dtype, ReduceOp op) {
  if (static_cast<int>(dtype) >= kNumDataTypes || static_cast<int>(op) >= kNumReduceOps) {
    return false;
  }
  const bool bitwise = op == ReduceOp::kBand || op == ReduceOp::kBor || op == ReduceOp::kBxor;
  switch (dtype) {
    case DataType::kInt8:
    case DataType::kInt16:
    case DataType::kInt32:
    case DataType::kInt64:
    case DataType::kUInt8: return true;
    case DataType::kBool: return op != ReduceOp::kAvg;
    case DataType::kComplex64:
    case DataType::kComplex128: return op == ReduceOp::kSum || op == ReduceOp::kAvg;
    case DataType::kQInt8:
    case DataType::kQInt4: return !bitwise && op != ReduceOp::kProd;
    default: return !bitwise;  // the floating-point types
  }
}

}  // namespace gflow
