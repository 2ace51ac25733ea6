// Chunk fusion copy throughput: gflow::gradient::pack/unpack over a bucket
// plan (planBuckets) of 1M, 4M, 16M and 64M buckets.
//
//   fusion_pack_bench --benchmark_filter='pack_resnet50'
//
// BM_{pack,unpack}_resnet50/<bucket bytes>: ResNet-50's 161 float32 gradients
//   (25.6M parameters, backward order, as bench/models/resnet50.txt).
// BM_{pack,unpack}/<tensor bytes>/<bucket bytes>: 64 MiB of equal tensors.
// Each iteration packs (or unpacks) every bucket of the plan through one
// fusion buffer; direct buckets (tensors >= the threshold) are reduced in
// place and copy nothing, so they count neither time nor bytes.
// bytes_per_second counts the bytes copied; counters: buckets in the plan and
// copied (not direct) buckets. Google Benchmark 1.7 takes --benchmark_min_time=0.05
// (seconds, no suffix).
#include <benchmark/benchmark.h>

#include <algorithm>
#include <cstdint>
#include <vector>

#include "gflow/types.h"
#include "gradient/bucket_plan.h"
#include "gradient/fusion.h"

namespace {

using gflow::gradient::BucketPlan;

// torchvision resnet50() parameter sizes, reversed (the order backward makes them).
std::vector<size_t> resnet50Counts() {
  std::vector<size_t> c = {64 * 3 * 7 * 7, 64, 64};
  auto conv = [&](size_t in, size_t out, size_t k) { c.push_back(out * in * k * k); };
  auto bn = [&](size_t ch) { c.insert(c.end(), {ch, ch}); };
  size_t inplanes = 64;
  const size_t planes[] = {64, 128, 256, 512}, blocks[] = {3, 4, 6, 3};
  for (int l = 0; l < 4; ++l) {
    const size_t p = planes[l];
    for (size_t b = 0; b < blocks[l]; ++b) {
      conv(inplanes, p, 1), bn(p), conv(p, p, 3), bn(p), conv(p, 4 * p, 1), bn(4 * p);
      if (b == 0) conv(inplanes, 4 * p, 1), bn(4 * p);
      inplanes = 4 * p;
    }
  }
  c.push_back(2048 * 1000), c.push_back(1000);
  std::reverse(c.begin(), c.end());
  return c;
}

struct Fixture {
  std::vector<std::vector<float>> storage;
  std::vector<gflow::Tensor> tensors;
  BucketPlan plan;
  std::vector<char> buffer;
  int64_t packedBytes = 0;  // per pass
  int copied = 0;           // buckets that are packed (not direct)

  Fixture(const std::vector<size_t>& counts, uint64_t bucketBytes) {
    for (size_t n : counts) storage.emplace_back(n, 1.0f);
    for (auto& s : storage) tensors.push_back(gflow::tensor(s.data(), s.size()));
    plan = gflow::gradient::planBuckets(tensors, bucketBytes);
    uint64_t most = 0;
    for (const auto& b : plan.buckets) {
      if (b.direct) continue;
      most = std::max(most, b.bytes);
      packedBytes += static_cast<int64_t>(b.bytes);
      ++copied;
    }
    buffer.assign(most, 0);
  }
};

void run(benchmark::State& state, const std::vector<size_t>& counts, uint64_t bucketBytes,
         bool packing) {
  Fixture f(counts, bucketBytes);
  for (auto _ : state) {
    for (const auto& b : f.plan.buckets) {
      if (b.direct) continue;
      if (packing) {
        gflow::gradient::pack(b, f.tensors, f.buffer.data());
      } else {
        gflow::gradient::unpack(b, f.buffer.data(), f.tensors);
      }
      benchmark::ClobberMemory();
    }
  }
  state.SetBytesProcessed(state.iterations() * f.packedBytes);
  state.counters["buckets"] = static_cast<double>(f.plan.buckets.size());
  state.counters["copied"] = f.copied;
}

void BM_pack_resnet50(benchmark::State& s) {
  run(s, resnet50Counts(), s.range(0), true);
}
void BM_unpack_resnet50(benchmark::State& s) {
  run(s, resnet50Counts(), s.range(0), false);
}

std::vector<size_t> uniform(int64_t tensorBytes) {
  constexpr int64_t kTotal = 64 << 20;
  return std::vector<size_t>(kTotal / tensorBytes, static_cast<size_t>(tensorBytes) / 4);
}
void BM_pack(benchmark::State& s) {
  run(s, uniform(s.range(0)), s.range(1), true);
}
void BM_unpack(benchmark::State& s) {
  run(s, uniform(s.range(0)), s.range(1), false);
}

void bucketArgs(benchmark::internal::Benchmark* b) {
  for (int64_t bucket : {1 << 20, 4 << 20, 16 << 20, 64 << 20}) b->Arg(bucket);
}
// Only tensors smaller than the bucket: the others are direct and copy nothing.
void uniformArgs(benchmark::internal::Benchmark* b) {
  for (int64_t tensor : {4 << 10, 64 << 10, 1 << 20}) {
    for (int64_t bucket : {1 << 20, 4 << 20, 16 << 20, 64 << 20}) {
      if (tensor < bucket) b->Args({tensor, bucket});
    }
  }
}

BENCHMARK(BM_pack_resnet50)->Apply(bucketArgs)->Unit(benchmark::kMillisecond);
BENCHMARK(BM_unpack_resnet50)->Apply(bucketArgs)->Unit(benchmark::kMillisecond);
BENCHMARK(BM_pack)->Apply(uniformArgs)->Unit(benchmark::kMillisecond);
BENCHMARK(BM_unpack)->Apply(uniformArgs)->Unit(benchmark::kMillisecond);

}  // namespace
