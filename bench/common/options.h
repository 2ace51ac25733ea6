// Command line of the allreduce sweep drivers (bench/allreduce_bw and the
// peer harnesses in bench/compare/), parsed once here so that every driver
// takes the same flags and means the same thing by them. The flags follow
// nccl-tests: -b/-e/-f/-i/-n/-w/-c/-d/-o/-a/-m.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "common/collective.h"
#include "gflow/types.h"

namespace gflow::bench {

struct SweepConfig {
  uint64_t minBytes = 8;                             // -b
  uint64_t maxBytes = 64 << 20;                      // -e
  uint64_t stepFactor = 2;                           // -f: multiply the size by this ...
  uint64_t stepBytes = 0;                            // -i: ... or, when non-zero, add this
  int iters = 20;                                    // -n
  int warmup = 5;                                    // -w
  bool check = true;                                 // -c
  bool inPlace = true;                               // -m: also run in-place
  std::vector<DataType> dtypes{DataType::kFloat32};  // -d
  std::vector<ReduceOp> ops{ReduceOp::kSum};         // -o
  std::string algorithm;                             // -a; empty: the library's default
  Collective collective = Collective::kAllreduce;    // --op
  bool csv = false;                                  // --csv
  bool json = false;                                 // --json
  std::string jsonFile;                              // --json FILE; empty: stdout
  std::string plotFile;                              // --plot FILE.png (bench/plot_busbw.py)
  bool linksTable = false;                           // --links
};

// A driver-specific flag that takes a value ("--store DIR").
struct ExtraFlag {
  std::string name;  // "--store"
  std::string metavar;
  std::string help;
  std::string* value;  // filled when the flag is given
};

// What a driver says about itself in --help.
struct DriverInfo {
  std::string program;        // "allreduce_bw"
  std::string description;    // one line
  std::string algorithmHelp;  // what -a accepts
  std::vector<ExtraFlag> extraFlags;
};

// Parses argv into `cfg`. Returns -1 to go on, or the exit code to leave with:
// 0 after --help, 2 after a usage error (the message is on stderr).
int parseSweepArgs(int argc, char** argv, DriverInfo& info, SweepConfig* cfg);

// "8", "64K", "1M", "1G" (powers of two). False on anything else.
bool parseSize(const std::string& s, uint64_t* out);
// 1536 -> "1.5K"; sizes in table notes.
std::string formatSize(uint64_t bytes);

// The message sizes of the sweep, ascending, from minBytes to at most maxBytes.
std::vector<uint64_t> sweepSizes(const SweepConfig& cfg);

}  // namespace gflow::bench
