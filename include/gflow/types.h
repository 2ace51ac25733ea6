// Element types, reduction operators, devices and the Tensor view that every
// gflow collective takes, and the per-peer traffic counters of Stats. A
// Tensor never owns memory: the caller keeps the buffer alive until the
// operation (or its Work) has completed.
#pragma once

#include <cstddef>
#include <cstdint>
#include <string>

#include "gflow/export.h"

namespace gflow {

enum class DataType : uint8_t {
  kFloat32 = 0,
  kFloat16 = 1,   // IEEE binary16; reductions accumulate in float32
  kBFloat16 = 2,  // bfloat16; reductions accumulate in float32
  kFloat64 = 3,
  kInt32 = 4,
  kInt64 = 5,
  kUInt8 = 6,
  kInt8 = 7,
  kInt16 = 8,
  kBool = 9,         // one byte, 0 or 1: sum and max are "or", prod and min "and"
  kFloat8E4M3 = 10,  // OCP float8 E4M3FN (no inf; 448 is the largest); in float32
  kFloat8E5M2 = 11,  // OCP float8 E5M2 (IEEE-like, with inf); reductions in float32
  kComplex64 = 12,   // two float32 (real, imaginary); sum and avg only
  kComplex128 = 13,  // two float64; sum and avg only
  // Block-quantized float32 (docs/compression.md), wire types of
  // AllreduceOptions and ReducerOptions: one element is a block of
  // kQuantBlock values, a float32 scale followed by kQuantBlock int8 values
  // (132 bytes) or kQuantBlock int4 values packed two per byte (68 bytes).
  // A reduction dequantizes both operands, applies the op in float32 and
  // quantizes the result again. Sum, avg, min and max.
  kQInt8 = 14,
  kQInt4 = 15,
};
constexpr int kNumDataTypes = 16;
// float32 values per kQInt8 / kQInt4 element (block).
constexpr size_t kQuantBlock = 128;

// Which op applies to which type (supportsReduceOp): every op to the integer
// types; sum, avg, min, max and prod to the floating-point types; sum and avg
// (part by part) to the complex types; sum, avg, min and max to the
// quantized types; to bool every op but avg. Integers wrap; avg on integers
// truncates toward zero.
enum class ReduceOp : uint8_t {
  kSum = 0,
  kAvg = 1,  // sum, then one division by the world size (integers truncate)
  kMin = 2,
  kMax = 3,
  kProd = 4,
  kBand = 5,  // bitwise and (integer types and bool)
  kBor = 6,   // bitwise or
  kBxor = 7,  // bitwise xor
};
constexpr int kNumReduceOps = 8;

enum class DeviceType : uint8_t {
  kCPU = 0,
  kCUDA = 1,  // device buffers: staged through pinned host memory (docs/backends.md)
};

struct Device {
  DeviceType type = DeviceType::kCPU;
  int index = -1;
};

// A non-owning view of `count` contiguous elements of `dtype` at `data`.
// Device tensors (device.type kCUDA) also name the CUDA stream (a
// cudaStream_t; nullptr: the legacy default stream) whose earlier work
// produces them: gflow waits for that work before reading them.
struct Tensor {
  void* data = nullptr;
  size_t count = 0;
  DataType dtype = DataType::kFloat32;
  Device device{};
  void* stream = nullptr;

  Tensor() = default;
  Tensor(void* d, size_t n, DataType t, Device dev = Device{}, void* s = nullptr)
      : data(d), count(n), dtype(t), device(dev), stream(s) {}

  size_t nbytes() const;
};

// Typed convenience constructors: gflow::tensor(vec.data(), vec.size()).
GFLOW_EXPORT Tensor tensor(float* data, size_t count);
GFLOW_EXPORT Tensor tensor(double* data, size_t count);
GFLOW_EXPORT Tensor tensor(int32_t* data, size_t count);
GFLOW_EXPORT Tensor tensor(int64_t* data, size_t count);
GFLOW_EXPORT Tensor tensor(uint8_t* data, size_t count);
GFLOW_EXPORT Tensor tensor(int8_t* data, size_t count);
GFLOW_EXPORT Tensor tensor(int16_t* data, size_t count);
GFLOW_EXPORT Tensor tensor(bool* data, size_t count);

// Bytes per element; 0 for a value outside the enum.
GFLOW_EXPORT size_t dataTypeSize(DataType dtype);
// Whether `dtype` is a block-quantized type (kQInt8, kQInt4).
GFLOW_EXPORT bool isQuantized(DataType dtype);
// Elements of `wire` that carry `count` float32 values: ceil(count /
// kQuantBlock) blocks for the quantized types, `count` otherwise.
GFLOW_EXPORT size_t wireElements(DataType wire, size_t count);
GFLOW_EXPORT const char* toString(DataType dtype);
GFLOW_EXPORT const char* toString(ReduceOp op);
GFLOW_EXPORT const char* toString(DeviceType type);
// Parses "float32", "fp32", "float", "half", "bf16", ... Throws gflow::Error.
GFLOW_EXPORT DataType parseDataType(const std::string& name);
GFLOW_EXPORT ReduceOp parseReduceOp(const std::string& name);
// Whether `op` applies to `dtype` (see ReduceOp); false for values outside
// the enums. A collective given a pair that does not raises invalid_argument.
GFLOW_EXPORT bool supportsReduceOp(DataType dtype, ReduceOp op);

// Traffic between this rank and one peer (Communicator::stats).
struct PeerStats {
  uint64_t bytesSent = 0;
  uint64_t bytesReceived = 0;
  uint64_t messagesSent = 0;
  uint64_t messagesReceived = 0;
  // Of bytesSent: what the peer read straight from this rank's buffers
  // (single copy between the ranks of one host, GFLOW_LOCAL_SINGLE_COPY).
  uint64_t singleCopyBytesSent = 0;
  // Connections this rank holds open to the peer now: TCP sockets (a local
  // link's stream counts as none) and verbs queue pairs.
  uint32_t connections = 0;
  // Stragglers (docs/errors.md): of the collectives this rank has a verdict
  // on, how many this rank (the index of Stats::peers; this rank's own
  // entry too) reached last, and the sum over those of how long after the
  // earliest rank it arrived, in ns.
  uint64_t timesLast = 0;
  uint64_t lateNs = 0;
  // The peer runs on this rank's host: the bytes above moved through shared
  // memory (or loopback TCP with GFLOW_SHM=0), never over the network.
  bool sameHost = false;
};

inline size_t Tensor::nbytes() const {
  return count * dataTypeSize(dtype);
}

}  // namespace gflow
