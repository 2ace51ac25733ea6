// Run-time dispatch for kernels/reduce.h and kernels/convert.h: CPU detection
// (cpuid + xgetbv), the active table, divide(), the wire conversions and the
// scalar conversions.
#include <cpuid.h>

#include <algorithm>
#include <atomic>
#include <cstring>

#include "common/check.h"
#include "kernels/convert.h"
#include "kernels/cpu/kernel_table.h"
#include "kernels/cpu/scalar.h"
#include "kernels/reduce.h"

namespace gflow::kernels {
namespace {

using cpu::KernelTable;

struct CpuSupport {
  bool avx2 = false;
  bool avx512 = false;
};

// XCR0: which register states the OS saves on a context switch. A CPU with
// AVX whose OS does not save YMM (or ZMM) state must not run those kernels.
uint64_t readXcr0() {
  uint32_t lo = 0;
  uint32_t hi = 0;
  __asm__ volatile("xgetbv" : "=a"(lo), "=d"(hi) : "c"(0));
  return (static_cast<uint64_t>(hi) << 32) | lo;
}

CpuSupport probeCpu() {
  // cpuid leaf 1 ecx and leaf 7 ebx bits (Intel SDM vol. 2A, CPUID).
  constexpr unsigned kFma = 1u << 12, kOsxsave = 1u << 27, kAvx = 1u << 28, kF16c = 1u << 29;
  constexpr unsigned kAvx2 = 1u << 5;
  constexpr unsigned kAvx512 = (1u << 16) | (1u << 17) | (1u << 30) | (1u << 31);  // F DQ BW VL
  constexpr uint64_t kXcr0Ymm = 0x6;   // SSE + AVX state
  constexpr uint64_t kXcr0Zmm = 0xE6;  // + opmask, ZMM0-15 upper halves, ZMM16-31

  CpuSupport s;
  unsigned eax = 0, ebx = 0, ecx = 0, edx = 0;
  if (__get_cpuid(1, &eax, &ebx, &ecx, &edx) == 0) return s;
  // The AVX2 file is compiled with -mfma and -mf16c too, so it needs all of them.
  const unsigned leaf1 = kFma | kOsxsave | kAvx | kF16c;
  if ((ecx & leaf1) != leaf1) return s;
  const uint64_t xcr0 = readXcr0();
  if ((xcr0 & kXcr0Ymm) != kXcr0Ymm || __get_cpuid_max(0, nullptr) < 7) return s;
  __cpuid_count(7, 0, eax, ebx, ecx, edx);
  s.avx2 = (ebx & kAvx2) != 0;
  s.avx512 = s.avx2 && (ebx & kAvx512) == kAvx512 && (xcr0 & kXcr0Zmm) == kXcr0Zmm;
  return s;
}

const CpuSupport& cpuSupport() {
  static const CpuSupport support = probeCpu();
  return support;
}

// Atomic so a reduceFn() racing with setIsa() reads either table, never a torn
// pointer; each table is immutable.
std::atomic<const KernelTable*>& activeTable() {
  static std::atomic<const KernelTable*> table{cpu::tableFor(detectedIsa())};
  return table;
}

int kernelColumn(ReduceOp op) {
  switch (op) {
    case ReduceOp::kSum:
    case ReduceOp::kAvg:  // the division happens once, in divide()
      return cpu::kOpSum;
    case ReduceOp::kMin: return cpu::kOpMin;
    case ReduceOp::kMax: return cpu::kOpMax;
    case ReduceOp::kProd: return cpu::kOpProd;
    case ReduceOp::kBand: return cpu::kOpBand;
    case ReduceOp::kBor: return cpu::kOpBor;
    case ReduceOp::kBxor: return cpu::kOpBxor;
  }
  return -1;
}

// Elementwise in place through memcpy: the buffer has no alignment promise.
template <class T, class Fn>
void divideEach(void* data, size_t count, Fn fn) {
  auto* p = static_cast<unsigned char*>(data);
  for (size_t i = 0; i < count; ++i, p += sizeof(T)) {
    T v;
    std::memcpy(&v, p, sizeof v);
    v = fn(v);
    std::memcpy(p, &v, sizeof v);
  }
}

// Half types: widen a block with the active table's conversion, divide in
// float32, round once on the way back.
void divideHalfType(void* data, size_t count, float divisor, cpu::WidenFn widen,
                    cpu::NarrowFn narrow) {
  constexpr size_t kBlock = 1024;
  float buf[kBlock];
  auto* p = static_cast<unsigned char*>(data);
  for (size_t done = 0; done < count; done += kBlock) {
    const size_t n = std::min(kBlock, count - done);
    unsigned char* block = p + done * sizeof(uint16_t);
    widen(buf, block, n);
    for (size_t i = 0; i < n; ++i) buf[i] /= divisor;
    narrow(block, buf, n);
  }
}

// Integers narrower than int64_t divide in it, so a divisor beyond their
// range simply gives 0 (truncation toward zero).
template <class T>
void divideInteger(void* data, size_t count, int64_t divisor) {
  divideEach<T>(data, count,
                [divisor](T v) { return static_cast<T>(static_cast<int64_t>(v) / divisor); });
}

template <class Fmt>
void divideFloat8(void* data, size_t count, int64_t divisor) {
  const auto d = static_cast<float>(divisor);
  divideEach<uint8_t>(data, count, [d](uint8_t v) {
    return cpu::floatToFloat8Scalar<Fmt>(cpu::float8ToFloatScalar<Fmt>(v) / d);
  });
}

// The quantized types' slot in the table; -1 for the others.
int quantSlot(DataType wire) {
  if (wire == DataType::kQInt8) return 0;
  if (wire == DataType::kQInt4) return 1;
  return -1;
}

// Quantized types: each block in float32, divided, quantized again.
void divideBlocks(void* data, size_t count, DataType dtype, int64_t divisor) {
  const KernelTable* t = activeTable().load(std::memory_order_acquire);
  const int slot = quantSlot(dtype);
  const size_t es = dataTypeSize(dtype);
  const auto d = static_cast<float>(divisor);
  float buf[kQuantBlock];
  auto* p = static_cast<unsigned char*>(data);
  for (size_t k = 0; k < count; ++k, p += es) {
    t->dequantize[slot](buf, p, kQuantBlock, 1.0f);
    for (float& v : buf) v /= d;
    t->quantize[slot](p, buf, kQuantBlock, 1.0f, nullptr);
  }
}

}  // namespace

namespace cpu {

const KernelTable* tableFor(Isa isa) {
  switch (isa) {
    case Isa::kBaseline: return &baselineTable();
    case Isa::kAvx2: return cpuSupport().avx2 ? &avx2Table() : nullptr;
    case Isa::kAvx512: return cpuSupport().avx512 ? &avx512Table() : nullptr;
  }
  return nullptr;
}

}  // namespace cpu

ReduceFn reduceFn(DataType dtype, ReduceOp op) {
  const auto type = static_cast<unsigned>(dtype);
  const int column = kernelColumn(op);
  ReduceFn fn = nullptr;
  if (type < static_cast<unsigned>(kNumDataTypes) && column >= 0) {
    fn = activeTable().load(std::memory_order_acquire)->reduce[type][column];
  }
  if (fn == nullptr || (dtype == DataType::kBool && op == ReduceOp::kAvg)) {
    GFLOW_THROW(kInvalidArgument, ErrorContext{})
        << "no reduction kernel for data type " << toString(dtype) << " (" << type << ") and op "
        << toString(op) << " (" << static_cast<unsigned>(op) << ")";
  }
  return fn;
}

void divide(void* data, size_t count, DataType dtype, int64_t divisor) {
  if (divisor < 1) {
    GFLOW_THROW(kInvalidArgument, ErrorContext{}) << "divide: divisor " << divisor << " < 1";
  }
  const KernelTable* table = activeTable().load(std::memory_order_acquire);
  switch (dtype) {
    case DataType::kFloat32: {
      const auto d = static_cast<float>(divisor);
      divideEach<float>(data, count, [d](float v) { return v / d; });
      return;
    }
    case DataType::kFloat64: {
      const auto d = static_cast<double>(divisor);
      divideEach<double>(data, count, [d](double v) { return v / d; });
      return;
    }
    case DataType::kFloat16:
      divideHalfType(data, count, static_cast<float>(divisor), table->halfToFloat,
                     table->floatToHalf);
      return;
    case DataType::kBFloat16:
      divideHalfType(data, count, static_cast<float>(divisor), table->bfloat16ToFloat,
                     table->floatToBfloat16);
      return;
    // Integers: C++ division truncates toward zero. Narrow types divide in
    // int64_t, so a divisor beyond their range simply gives 0.
    case DataType::kInt32: return divideInteger<int32_t>(data, count, divisor);
    case DataType::kInt64:
      divideEach<int64_t>(data, count, [divisor](int64_t v) { return v / divisor; });
      return;
    case DataType::kUInt8: return divideInteger<uint8_t>(data, count, divisor);
    case DataType::kInt8: return divideInteger<int8_t>(data, count, divisor);
    case DataType::kInt16: return divideInteger<int16_t>(data, count, divisor);
    // float8: in float32, rounded once.
    case DataType::kFloat8E4M3: return divideFloat8<cpu::E4M3>(data, count, divisor);
    case DataType::kFloat8E5M2: return divideFloat8<cpu::E5M2>(data, count, divisor);
    // Complex: both parts.
    case DataType::kComplex64: return divide(data, 2 * count, DataType::kFloat32, divisor);
    case DataType::kComplex128: return divide(data, 2 * count, DataType::kFloat64, divisor);
    case DataType::kQInt8:
    case DataType::kQInt4: return divideBlocks(data, count, dtype, divisor);
    case DataType::kBool: break;  // avg does not apply
  }
  GFLOW_THROW(kInvalidArgument, ErrorContext{})
      << "divide: no division for data type " << toString(dtype) << " ("
      << static_cast<unsigned>(dtype) << ")";
}

const char* toString(Isa isa) {
  switch (isa) {
    case Isa::kBaseline: return "baseline";
    case Isa::kAvx2: return "avx2";
    case Isa::kAvx512: return "avx512";
  }
  return "invalid";
}

Isa detectedIsa() {
  const CpuSupport& s = cpuSupport();
  if (s.avx512) return Isa::kAvx512;
  if (s.avx2) return Isa::kAvx2;
  return Isa::kBaseline;
}

Isa activeIsa() {
  return activeTable().load(std::memory_order_acquire)->isa;
}

bool setIsa(Isa isa) {
  const KernelTable* table = cpu::tableFor(isa);
  if (table == nullptr) return false;
  activeTable().store(table, std::memory_order_release);
  return true;
}

void narrow(void* dst, const float* src, size_t count, DataType wire, float scale,
            float* residual) {
  const KernelTable* t = activeTable().load(std::memory_order_acquire);
  if (const int q = quantSlot(wire); q >= 0)
    return t->quantize[q](dst, src, count, scale, residual);
  if (residual != nullptr) {
    GFLOW_THROW(kInvalidArgument, ErrorContext{})
        << "narrow: error feedback needs a quantized wire (qint8, qint4), not " << toString(wire);
  }
  if (wire == DataType::kFloat16) {
    scale == 1.0f ? t->floatToHalf(dst, src, count) : t->floatToHalfScaled(dst, src, count, scale);
  } else if (wire == DataType::kBFloat16) {
    scale == 1.0f ? t->floatToBfloat16(dst, src, count)
                  : t->floatToBfloat16Scaled(dst, src, count, scale);
  } else if (wire == DataType::kFloat8E4M3 || wire == DataType::kFloat8E5M2) {
    auto* d = static_cast<uint8_t*>(dst);
    const bool e4 = wire == DataType::kFloat8E4M3;
    for (size_t i = 0; i < count; ++i) {
      const float v = src[i] * scale;
      d[i] = e4 ? floatToFloat8e4m3(v) : floatToFloat8e5m2(v);
    }
  } else {
    GFLOW_THROW(kInvalidArgument, ErrorContext{})
        << "narrow: type " << toString(wire) << " is not float16, bfloat16, float8, qint8 or qint4";
  }
}

void widen(float* dst, const void* src, size_t count, DataType wire, float scale) {
  const KernelTable* t = activeTable().load(std::memory_order_acquire);
  if (const int q = quantSlot(wire); q >= 0) return t->dequantize[q](dst, src, count, scale);
  if (wire == DataType::kFloat16) {
    scale == 1.0f ? t->halfToFloat(dst, src, count) : t->halfToFloatScaled(dst, src, count, scale);
  } else if (wire == DataType::kBFloat16) {
    scale == 1.0f ? t->bfloat16ToFloat(dst, src, count)
                  : t->bfloat16ToFloatScaled(dst, src, count, scale);
  } else if (wire == DataType::kFloat8E4M3 || wire == DataType::kFloat8E5M2) {
    const auto* s = static_cast<const uint8_t*>(src);
    const bool e4 = wire == DataType::kFloat8E4M3;
    for (size_t i = 0; i < count; ++i) {
      dst[i] = (e4 ? float8e4m3ToFloat(s[i]) : float8e5m2ToFloat(s[i])) * scale;
    }
  } else {
    GFLOW_THROW(kInvalidArgument, ErrorContext{})
        << "widen: type " << toString(wire) << " is not float16, bfloat16, float8, qint8 or qint4";
  }
}

namespace {
// Whether v's exponent bits are all ones, as 0 or 1.
template <class U>
U exponentAllOnes(U v, U mask) {
  return static_cast<U>((v & mask) == mask);
}

// Any element whose exponent bits are all ones (inf or NaN). An OR over
// blocks of a fixed size (no early exit inside one): GCC's -O2 cost model
// vectorises only such loops (a loop over `count` stayed scalar, and was
// the largest cost of a float16 allreduce's progress thread). A block stops
// the scan at the first inf or NaN it holds.
template <class U>
bool anyExponentAllOnes(const void* data, size_t count, U mask) {
  constexpr size_t kBlock = 256;
  const auto* p = static_cast<const unsigned char*>(data);
  size_t i = 0;
  for (; i + kBlock <= count; i += kBlock) {
    U block[kBlock];
    std::memcpy(block, p + i * sizeof(U), sizeof block);
    U any = 0;
    for (size_t j = 0; j < kBlock; ++j) any |= exponentAllOnes(block[j], mask);
    if (any) return true;
  }
  U any = 0;
  for (; i < count; ++i) {
    U v;
    std::memcpy(&v, p + i * sizeof(U), sizeof(U));
    any |= exponentAllOnes(v, mask);
  }
  return any != 0;
}
}  // namespace

bool anyNonFinite(const void* data, size_t count, DataType dtype) {
  switch (dtype) {
    case DataType::kFloat32: return anyExponentAllOnes<uint32_t>(data, count, 0x7f800000u);
    case DataType::kFloat64:
      return anyExponentAllOnes<uint64_t>(data, count, 0x7ff0000000000000ull);
    case DataType::kFloat16:
      return anyExponentAllOnes<uint16_t>(data, count, static_cast<uint16_t>(0x7c00));
    case DataType::kBFloat16:
      return anyExponentAllOnes<uint16_t>(data, count, static_cast<uint16_t>(0x7f80));
    case DataType::kFloat8E5M2:
      return anyExponentAllOnes<uint8_t>(data, count, static_cast<uint8_t>(0x7c));
    case DataType::kFloat8E4M3:  // no inf: only S.1111.111 (NaN)
      return anyExponentAllOnes<uint8_t>(data, count, static_cast<uint8_t>(0x7f));
    case DataType::kComplex64: return anyNonFinite(data, 2 * count, DataType::kFloat32);
    case DataType::kComplex128: return anyNonFinite(data, 2 * count, DataType::kFloat64);
    case DataType::kQInt8:
    case DataType::kQInt4: {  // a block's scale
      const size_t es = dataTypeSize(dtype);
      const auto* p = static_cast<const unsigned char*>(data);
      bool any = false;
      for (size_t k = 0; k < count; ++k) any |= anyNonFinite(p + k * es, 1, DataType::kFloat32);
      return any;
    }
    default: return false;
  }
}

float halfToFloat(uint16_t h) {
  return cpu::halfToFloatScalar(h);
}
uint16_t floatToHalf(float f) {
  return cpu::floatToHalfScalar(f);
}
float bfloat16ToFloat(uint16_t b) {
  return cpu::bfloat16ToFloatScalar(b);
}
uint16_t floatToBfloat16(float f) {
  return cpu::floatToBfloat16Scalar(f);
}
float float8e4m3ToFloat(uint8_t b) {
  return cpu::float8ToFloatScalar<cpu::E4M3>(b);
}
uint8_t floatToFloat8e4m3(float f) {
  return cpu::floatToFloat8Scalar<cpu::E4M3>(f);
}
float float8e5m2ToFloat(uint8_t b) {
  return cpu::float8ToFloatScalar<cpu::E5M2>(b);
}
uint8_t floatToFloat8e5m2(float f) {
  return cpu::floatToFloat8Scalar<cpu::E5M2>(f);
}

}  // namespace gflow::kernels
