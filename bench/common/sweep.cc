#include "common/sweep.h"

#include <chrono>
#include <cstdlib>
#include <cstring>
#include <memory>
#include <optional>
#include <utility>
#include <vector>

#include "common/pattern.h"

namespace gflow::bench {
namespace {

struct FreeDeleter {
  void operator()(void* p) const { std::free(p); }
};
using Buffer = std::unique_ptr<uint8_t, FreeDeleter>;

// Page-aligned, like the buffers frameworks hand to a collective.
Buffer allocate(size_t bytes) {
  size_t rounded = (bytes + 4095) / 4096 * 4096;
  void* p = std::aligned_alloc(4096, rounded == 0 ? 4096 : rounded);
  if (p == nullptr) throw std::bad_alloc();
  std::memset(p, 0, rounded == 0 ? 4096 : rounded);  // touch every page before timing
  return Buffer(static_cast<uint8_t*>(p));
}

// A value the op maps to itself on every rank: x op x op ... == x.
double stableValue(ReduceOp op) {
  return op == ReduceOp::kProd ? 1 : 0;
}

Measurement measure(Backend& be, const SweepConfig& cfg, const CollectiveCheck& check, void* in,
                    void* out, size_t count, DataType dtype, ReduceOp op) {
  const Collective c = cfg.collective;
  fillValue(dtype, stableValue(op), in, count);
  if (out != in) fillValue(dtype, stableValue(op), out, count);
  const uint64_t bytes = count * dataTypeSize(dtype);
  std::function<void()> run = be.prepare(c, in, out, count, dtype, op);
  be.upload(in, out, bytes);

  for (int i = 0; i < cfg.warmup; ++i) run();
  be.barrier();
  // Receive counters: a rank's own op is done with what it receives when it
  // returns, so nothing of the timed runs is missed or left over.
  const std::vector<PeerLink> before = be.links();
  auto t0 = std::chrono::steady_clock::now();
  for (int i = 0; i < cfg.iters; ++i) run();
  auto t1 = std::chrono::steady_clock::now();
  const std::vector<PeerLink> after = be.links();
  double us = std::chrono::duration<double, std::micro>(t1 - t0).count() / cfg.iters;

  Measurement m = makeMeasurement(bytes, be.maxOverRanks(us), busFactor(c, be.size()));
  if (!before.empty()) {
    // Nothing counted on any link (one rank, or a path that does not count
    // its traffic): no link columns rather than a busiest link of 0 bytes.
    LinkBytes l = gatherLinks(be, before, after, cfg.iters);
    if (l.busiest > 0) m.links = std::move(l);
  }
  if (cfg.check) {
    // Zero never is a correct result (every checked value is >= 1), so an
    // output the library leaves untouched counts as wrong.
    if (out != in) std::memset(out, 0, bytes);
    check.fillInputs(in, out, count);
    be.upload(in, out, bytes);
    run();
    be.download(out, bytes);
    m.wrong = be.sumOverRanks(check.countWrong(out, count));
  }
  return m;
}

}  // namespace

int runSweep(Backend& be, const SweepConfig& cfg) {
  std::vector<uint64_t> sizes = sweepSizes(cfg);
  uint64_t largest = sizes.empty() ? 0 : sizes.back();
  Buffer in = allocate(largest);
  Buffer out = allocate(largest);

  std::optional<Report> report;
  if (be.rank() == 0) {
    report.emplace(cfg, be.info());
    report->header();
  }
  int64_t wrong = 0;
  const Collective c = cfg.collective;
  if (!be.supports(c)) {
    if (report) {
      report->note(std::string("skipping ") + toString(c) + ": not supported by " +
                   be.info().library);
    }
    return report && !report->finish() ? 1 : 0;
  }
  // Ops that apply no ReduceOp run once per dtype (labelled with the first).
  std::vector<ReduceOp> ops = cfg.ops;
  if (!reduces(c)) ops.resize(1);
  const size_t n = static_cast<size_t>(be.size());
  for (DataType dtype : cfg.dtypes) {
    size_t esize = dataTypeSize(dtype);
    for (ReduceOp op : ops) {
      if (reduces(c) && !be.supports(dtype, op)) {
        if (report) {
          report->note(std::string("skipping ") + toString(dtype) + " " + toString(op) +
                       ": not supported by " + be.info().library);
        }
        continue;
      }
      CollectiveCheck check(c, dtype, op, be.rank(), be.size());
      for (uint64_t bytes : sizes) {
        size_t count = bytes / esize;
        if (blocked(c)) count -= count % n;
        if (count == 0) continue;
        Row row;
        row.bytes = count * esize;
        row.count = count;
        row.dtype = dtype;
        row.op = op;
        row.outOfPlace = measure(be, cfg, check, in.get(), out.get(), count, dtype, op);
        if (cfg.inPlace && c == Collective::kAllreduce) {
          row.hasInPlace = true;
          row.inPlace = measure(be, cfg, check, in.get(), in.get(), count, dtype, op);
        }
        wrong += std::max<int64_t>(row.outOfPlace.wrong, 0) +
                 (row.hasInPlace ? std::max<int64_t>(row.inPlace.wrong, 0) : 0);
        if (report) report->add(row);
      }
    }
  }
  bool ok = wrong == 0;
  if (report && !report->finish()) ok = false;
  return ok ? 0 : 1;
}

}  // namespace gflow::bench
