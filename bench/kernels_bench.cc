// Reduction kernel throughput per ISA x dtype x op, 4 KiB .. 64 MiB per buffer.
//
//   kernels_bench --benchmark_filter='reduce/avx2/float32/sum/'
//
// Each iteration runs dst = a op b in place (dst == a), the way the ring
// allreduce uses it. bytes_per_second counts the memory traffic: two buffers
// read and one written, i.e. 3 x the argument. b holds the op's identity (0 for
// sum, 1 for prod), so repeating the op leaves a unchanged: no drift into inf,
// NaN or subnormals, whose slow paths would distort the numbers.
#include <benchmark/benchmark.h>

#include <cstdint>
#include <cstring>
#include <string>
#include <vector>

#include "kernels/convert.h"
#include "kernels/cpu/kernel_table.h"
#include "kernels/reduce.h"
#include "kernels/sparse.h"

namespace {

using gflow::DataType;
using gflow::ReduceOp;
using gflow::kernels::Isa;

// Element i of a buffer holding `value + (i % 64)` in dtype's encoding.
void fill(DataType dtype, std::vector<uint8_t>& buf, double value, bool vary) {
  const size_t size = gflow::dataTypeSize(dtype);
  const size_t count = buf.size() / size;
  if (gflow::isQuantized(dtype)) {  // blocks of those values
    std::vector<float> f(count * gflow::kQuantBlock);
    for (size_t i = 0; i < f.size(); ++i) {
      f[i] = static_cast<float>(value + (vary ? static_cast<double>(i % 64) : 0.0));
    }
    gflow::kernels::narrow(buf.data(), f.data(), f.size(), dtype);
    return;
  }
  for (size_t i = 0; i < count; ++i) {
    const double v = value + (vary ? static_cast<double>(i % 64) : 0.0);
    uint8_t* p = buf.data() + i * size;
    switch (dtype) {
      case DataType::kFloat32: {
        const auto f = static_cast<float>(v);
        std::memcpy(p, &f, 4);
        break;
      }
      case DataType::kFloat64: std::memcpy(p, &v, 8); break;
      case DataType::kFloat16: {
        const uint16_t h = gflow::kernels::floatToHalf(static_cast<float>(v));
        std::memcpy(p, &h, 2);
        break;
      }
      case DataType::kBFloat16: {
        const uint16_t h = gflow::kernels::floatToBfloat16(static_cast<float>(v));
        std::memcpy(p, &h, 2);
        break;
      }
      case DataType::kInt32: {
        const auto x = static_cast<int32_t>(v);
        std::memcpy(p, &x, 4);
        break;
      }
      case DataType::kInt64: {
        const auto x = static_cast<int64_t>(v);
        std::memcpy(p, &x, 8);
        break;
      }
      case DataType::kUInt8: *p = static_cast<uint8_t>(v); break;
      case DataType::kInt8: *p = static_cast<uint8_t>(static_cast<int8_t>(v)); break;
      case DataType::kInt16: {
        const auto x = static_cast<int16_t>(v);
        std::memcpy(p, &x, 2);
        break;
      }
      case DataType::kBool: *p = v != 0 ? 1 : 0; break;
      case DataType::kFloat8E4M3:
        *p = gflow::kernels::floatToFloat8e4m3(static_cast<float>(v));
        break;
      case DataType::kFloat8E5M2:
        *p = gflow::kernels::floatToFloat8e5m2(static_cast<float>(v));
        break;
      case DataType::kComplex64: {
        const float f[2] = {static_cast<float>(v), -static_cast<float>(v)};
        std::memcpy(p, f, 8);
        break;
      }
      case DataType::kComplex128: {
        const double d[2] = {v, -v};
        std::memcpy(p, d, 16);
        break;
      }
      case DataType::kQInt8:
      case DataType::kQInt4: break;  // above
    }
  }
}

void reduceBench(benchmark::State& state, Isa isa, DataType dtype, ReduceOp op) {
  const auto bytes = static_cast<size_t>(state.range(0));
  const size_t count = bytes / gflow::dataTypeSize(dtype);
  const Isa saved = gflow::kernels::activeIsa();
  if (!gflow::kernels::setIsa(isa)) {
    state.SkipWithError("ISA not supported by this CPU");
    return;
  }
  const gflow::kernels::ReduceFn fn = gflow::kernels::reduceFn(dtype, op);
  std::vector<uint8_t> a(bytes), b(bytes);
  fill(dtype, a, 1.0, true);
  switch (op) {
    case ReduceOp::kSum:
    case ReduceOp::kAvg: fill(dtype, b, 0.0, false); break;
    case ReduceOp::kProd: fill(dtype, b, 1.0, false); break;
    case ReduceOp::kMin:
    case ReduceOp::kMax:
    case ReduceOp::kBand:
    case ReduceOp::kBor:
    case ReduceOp::kBxor: fill(dtype, b, 17.0, true); break;
  }
  for (auto _ : state) {
    fn(a.data(), a.data(), b.data(), count);
    benchmark::ClobberMemory();
  }
  state.SetBytesProcessed(static_cast<int64_t>(state.iterations()) *
                          static_cast<int64_t>(3 * bytes));
  gflow::kernels::setIsa(saved);
}

// Block quantization of `bytes` of float32 values (bytes_per_second counts
// those float32 bytes): "quantize" (with error feedback: "feedback"), or
// "dequantize".
void quantBench(benchmark::State& state, Isa isa, DataType wire, int mode) {
  const auto bytes = static_cast<size_t>(state.range(0));
  const size_t count = bytes / sizeof(float);
  const Isa saved = gflow::kernels::activeIsa();
  if (!gflow::kernels::setIsa(isa)) {
    state.SkipWithError("ISA not supported by this CPU");
    return;
  }
  std::vector<float> x(count), residual(count, 0.0f);
  for (size_t i = 0; i < count; ++i) x[i] = static_cast<float>(i % 1000) * 0.001f - 0.5f;
  std::vector<uint8_t> blocks(gflow::wireElements(wire, count) * gflow::dataTypeSize(wire));
  gflow::kernels::narrow(blocks.data(), x.data(), count, wire);
  for (auto _ : state) {
    if (mode == 2) {
      gflow::kernels::widen(x.data(), blocks.data(), count, wire);
    } else {
      gflow::kernels::narrow(blocks.data(), x.data(), count, wire, 1.0f,
                             mode == 1 ? residual.data() : nullptr);
    }
    benchmark::ClobberMemory();
  }
  state.SetBytesProcessed(static_cast<int64_t>(state.iterations()) * static_cast<int64_t>(bytes));
  gflow::kernels::setIsa(saved);
}

// The scan for inf/NaN that a compressed allreduce runs over its reduced
// wire buffer (kernels::anyNonFinite) on `bytes` of finite values, the
// whole buffer read (bytes_per_second counts them).
void nonFiniteBench(benchmark::State& state, DataType dtype) {
  const auto bytes = static_cast<size_t>(state.range(0));
  std::vector<uint8_t> buf(bytes);
  fill(dtype, buf, 1.0, true);
  const size_t count = bytes / gflow::dataTypeSize(dtype);
  for (auto _ : state) {
    benchmark::DoNotOptimize(gflow::kernels::anyNonFinite(buf.data(), count, dtype));
  }
  state.SetBytesProcessed(static_cast<int64_t>(state.iterations()) * static_cast<int64_t>(bytes));
}
BENCHMARK_CAPTURE(nonFiniteBench, float16, DataType::kFloat16)
    ->Name("nonfinite/float16")
    ->Arg(1 << 20)
    ->Arg(64 << 20);
BENCHMARK_CAPTURE(nonFiniteBench, float32, DataType::kFloat32)
    ->Name("nonfinite/float32")
    ->Arg(1 << 20)
    ->Arg(64 << 20);

// CSC's error-feedback pass (kernels::accumulateL1: v += g and the L1 norm
// of v) over `bytes` of float32 v and g (bytes_per_second: two read, one
// written, 3 x the argument).
void accumulateBench(benchmark::State& state) {
  const auto bytes = static_cast<size_t>(state.range(0));
  const size_t count = bytes / sizeof(float);
  std::vector<float> v(count, 0.5f), g(count);
  for (size_t i = 0; i < count; ++i) g[i] = (i % 2 ? 1e-3f : -1e-3f);  // v stays near 0.5
  for (auto _ : state) {
    benchmark::DoNotOptimize(gflow::kernels::accumulateL1(v.data(), g.data(), count));
    benchmark::ClobberMemory();
  }
  state.SetBytesProcessed(static_cast<int64_t>(state.iterations()) *
                          static_cast<int64_t>(3 * bytes));
}
BENCHMARK(accumulateBench)->Name("csc_accumulate")->Arg(1 << 20)->Arg(64 << 20);

// The roofline for the numbers above: memcpy of one buffer (bytes_per_second
// counts read + write, 2 x the argument).
void memcpyBench(benchmark::State& state) {
  const auto bytes = static_cast<size_t>(state.range(0));
  std::vector<uint8_t> src(bytes, 1), dst(bytes, 2);
  for (auto _ : state) {
    std::memcpy(dst.data(), src.data(), bytes);
    benchmark::ClobberMemory();
  }
  state.SetBytesProcessed(static_cast<int64_t>(state.iterations()) *
                          static_cast<int64_t>(2 * bytes));
}
BENCHMARK(memcpyBench)->Name("memcpy")->RangeMultiplier(4)->Range(4 << 10, 64 << 20);
// The memory-bandwidth bound of the shared-memory backend (performance.md):
// 256 MiB copies, out of every cache, on 1 and 2 threads at once
// (bytes_per_second is per thread).
BENCHMARK(memcpyBench)->Name("memcpy_dram")->Arg(256 << 20)->Threads(1)->Threads(2)->UseRealTime();

// Registers reduce/<isa>/<dtype>/<op>/<bytes> for every ISA this CPU runs.
int registerAll() {
  constexpr ReduceOp kOps[] = {ReduceOp::kSum,  ReduceOp::kMin,  ReduceOp::kMax,
                               ReduceOp::kProd, ReduceOp::kBand, ReduceOp::kBxor};
  for (Isa isa : {Isa::kBaseline, Isa::kAvx2, Isa::kAvx512}) {
    if (gflow::kernels::cpu::tableFor(isa) == nullptr) continue;
    for (int t = 0; t < gflow::kNumDataTypes; ++t) {
      const auto dtype = static_cast<DataType>(t);
      for (ReduceOp op : kOps) {
        if (!gflow::supportsReduceOp(dtype, op)) continue;
        const std::string name = std::string("reduce/") + gflow::kernels::toString(isa) + "/" +
                                 gflow::toString(dtype) + "/" + gflow::toString(op);
        benchmark::RegisterBenchmark(name.c_str(), reduceBench, isa, dtype, op)
            ->RangeMultiplier(4)
            ->Range(4 << 10, 64 << 20);
      }
    }
    for (DataType wire : {DataType::kQInt8, DataType::kQInt4}) {
      const char* modes[] = {"quantize", "feedback", "dequantize"};
      for (int m = 0; m < 3; ++m) {
        const std::string name = std::string(modes[m]) + "/" + gflow::kernels::toString(isa) + "/" +
                                 gflow::toString(wire);
        benchmark::RegisterBenchmark(name.c_str(), quantBench, isa, wire, m)
            ->RangeMultiplier(16)
            ->Range(64 << 10, 16 << 20);
      }
    }
  }
  return 0;
}

const int kRegistered = registerAll();

}  // namespace
