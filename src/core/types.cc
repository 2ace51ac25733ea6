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

size_t dataTypeSize(DataType dtype) {
  switch (dtype) {
    case DataType::kFloat32: return 4;
    case DataType::kFloat16: return 2;
    case DataType::kBFloat16: return 2;
    case DataType::kFloat64: return 8;
    case DataType::kInt32: return 4;
    case DataType::kInt64: return 8;
    case DataType::kUInt8: return 1;
  }
  return 0;
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
  GFLOW_THROW(kInvalidArgument, ErrorContext{})
      << "unknown data type '" << name
      << "' (expected float32, float16, bfloat16, float64, int32, int64 or uint8)";
}

ReduceOp parseReduceOp(const std::string& name) {
  const std::string n = lower(name);
  if (n == "sum") return ReduceOp::kSum;
  if (n == "avg" || n == "mean") return ReduceOp::kAvg;
  if (n == "min") return ReduceOp::kMin;
  if (n == "max") return ReduceOp::kMax;
  if (n == "prod" || n == "product") return ReduceOp::kProd;
  GFLOW_THROW(kInvalidArgument, ErrorContext{})
      << "unknown reduce op '" << name << "' (expected sum, avg, min, max or prod)";
}

}  // namespace gflow
