// The one output format of every allreduce sweep driver: an nccl-tests style
// table (default), CSV (--csv) or JSON (--json). Only rank 0 builds a Report.
//
// Bandwidths follow nccl-tests: algbw = bytes / time, and
// busbw = algbw * 2(n-1)/n, the per-link traffic of a bandwidth-optimal
// allreduce, comparable across world sizes and with the link speed. Where
// the library counts its traffic per peer, the table adds what the links
// really carried per op (common/links.h): the most a rank sent to other
// hosts (net) and to its own host (local), and '!' when busbw is above the
// busiest of those links' rate; --links prints every rank pair.
#pragma once

#include <cstdint>
#include <cstdio>
#include <optional>
#include <string>
#include <vector>

#include "common/links.h"
#include "common/options.h"
#include "gflow/types.h"

namespace gflow::bench {

struct Measurement {
  double timeUs = 0;   // max over ranks of the mean time per iteration
  double algbw = 0;    // GB/s
  double busbw = 0;    // GB/s
  int64_t wrong = -1;  // wrong elements summed over ranks; -1: not checked
  // What each link carried per op, where the library counts it (none: NCCL,
  // the peers' harnesses).
  std::optional<LinkBytes> links;
  bool busbwAboveBusiest() const { return links && links->busbwAboveBusiest(busbw, timeUs); }
};

// busFactor: algorithm to bus bandwidth (common/collective.h).
Measurement makeMeasurement(uint64_t bytes, double timeUs, double busFactor);

struct Row {
  uint64_t bytes = 0;
  size_t count = 0;
  DataType dtype = DataType::kFloat32;
  ReduceOp op = ReduceOp::kSum;
  Measurement outOfPlace;
  bool hasInPlace = false;
  Measurement inPlace;
  // The flag of the row: either run's busbw above its busiest link's rate.
  bool busbwAboveBusiest() const {
    return outOfPlace.busbwAboveBusiest() || (hasInPlace && inPlace.busbwAboveBusiest());
  }
};

struct RunInfo {
  std::string library;    // "gflow", "gloo", "mpi"
  std::string algorithm;  // "auto", "ring", ...
  int worldSize = 0;
  std::string extra;         // free-form line for the header (transport, version, ...)
  bool countsLinks = false;  // the table gets the per-link columns
};

class Report {
 public:
  Report(const SweepConfig& cfg, RunInfo info);

  void header();
  // A remark ("skipping float16: not supported"): a '#' line in the table,
  // stderr in the machine-readable formats.
  void note(const std::string& text);
  // Prints the row at once (so long sweeps show progress) and keeps it for
  // the summary and JSON.
  void add(const Row& row);
  // Summary lines, then the JSON document and the plot if asked for.
  // Returns false when the JSON file or the plot cannot be written.
  bool finish();

  int64_t wrong() const { return wrong_; }

 private:
  double avgBusbw() const;
  void writeJson(FILE* f) const;
  bool plot() const;                     // --plot
  void pairTable(const Row& row) const;  // --links

  int flagged_ = 0;  // measurements whose busbw is above the busiest link's rate

  SweepConfig cfg_;
  RunInfo info_;
  FILE* text_;  // where the table or CSV goes; summary lines follow it
  FILE* meta_;  // notes and the summary (stdout with the table, else stderr)
  std::vector<Row> rows_;
  int64_t wrong_ = 0;
};

}  // namespace gflow::bench
