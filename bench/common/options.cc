#include "common/options.h"

#include <cerrno>
#include <cstdio>
#include <cstdlib>

#include "common/pattern.h"
#include "gflow/error.h"

namespace gflow::bench {
namespace {

const DataType kAllTypes[] = {DataType::kFloat32, DataType::kFloat16, DataType::kBFloat16,
                              DataType::kFloat64, DataType::kInt32,   DataType::kInt64,
                              DataType::kUInt8,   DataType::kInt8,    DataType::kInt16};
const ReduceOp kAllOps[] = {ReduceOp::kSum,  ReduceOp::kAvg,  ReduceOp::kMin, ReduceOp::kMax,
                            ReduceOp::kProd, ReduceOp::kBand, ReduceOp::kBor, ReduceOp::kBxor};

void printHelp(const DriverInfo& info) {
  std::printf(
      "Usage: %s [options]\n"
      "%s\n"
      "\n"
      "  -b SIZE      smallest message in bytes (default 8; K, M, G suffixes)\n"
      "  -e SIZE      largest message in bytes (default 64M)\n"
      "  -f FACTOR    multiply the size by FACTOR each step (default 2)\n"
      "  -i BYTES     add BYTES each step instead of multiplying\n"
      "  -n ITERS     timed iterations per size (default 20)\n"
      "  -w ITERS     warm-up iterations per size (default 5)\n"
      "  -c 0|1       check results against the exact expected values (default 1)\n"
      "  -d TYPE      float32, float16, bfloat16, float64, int32, int64, uint8 or all\n"
      "               (default float32; a comma-separated list also works)\n"
      "  -o OP        sum, avg, min, max, prod or all (default sum; a list also works)\n"
      "  -a ALGO      %s\n"
      "  -m 0|1       also run in-place (default 1; allreduce only)\n"
      "  --op NAME    the collective: allreduce (default), reduce, broadcast, allgather,\n"
      "               reducescatter, gather, scatter, alltoall (rooted ops: root 0),\n"
      "               sendrecv (to the next rank, from the previous)\n"
      "  --csv        print CSV instead of the table\n"
      "  --json [F]   also write JSON to file F (with no F: JSON alone on stdout)\n"
      "  --plot F     also draw busbw against size into the PNG F (bench/plot_busbw.py,\n"
      "               matplotlib)\n"
      "  --links      after each row, the bytes every rank pair carried per op (where\n"
      "               the library counts them; the columns net and local and the flag\n"
      "               '!' come without it)\n",
      info.program.c_str(), info.description.c_str(), info.algorithmHelp.c_str());
  for (const ExtraFlag& f : info.extraFlags) {
    std::string lhs = f.name + " " + f.metavar;
    std::printf("  %-11s  %s\n", lhs.c_str(), f.help.c_str());
  }
  std::printf("  -h, --help   this text\n");
}

int usage(const DriverInfo& info, const std::string& msg) {
  std::fprintf(stderr, "%s: %s (try --help)\n", info.program.c_str(), msg.c_str());
  return 2;
}

bool parseInt(const std::string& s, long lo, long hi, long* out) {
  char* end = nullptr;
  errno = 0;
  long v = std::strtol(s.c_str(), &end, 10);
  if (s.empty() || errno != 0 || *end != '\0' || v < lo || v > hi) return false;
  *out = v;
  return true;
}

std::vector<std::string> splitList(const std::string& s) {
  std::vector<std::string> out;
  size_t start = 0;
  for (;;) {
    size_t comma = s.find(',', start);
    out.push_back(s.substr(start, comma - start));
    if (comma == std::string::npos) return out;
    start = comma + 1;
  }
}

}  // namespace

bool parseSize(const std::string& s, uint64_t* out) {
  if (s.empty() || s[0] < '0' || s[0] > '9') return false;
  char* end = nullptr;
  errno = 0;
  unsigned long long v = std::strtoull(s.c_str(), &end, 10);
  if (errno != 0) return false;
  std::string suffix(end);
  unsigned shift = 0;
  if (suffix == "K" || suffix == "k") {
    shift = 10;
  } else if (suffix == "M" || suffix == "m") {
    shift = 20;
  } else if (suffix == "G" || suffix == "g") {
    shift = 30;
  } else if (!suffix.empty() && suffix != "B" && suffix != "b") {
    return false;
  }
  if (v > (UINT64_MAX >> shift)) return false;
  *out = static_cast<uint64_t>(v) << shift;
  return true;
}

std::string formatSize(uint64_t bytes) {
  const char* units[] = {"B", "K", "M", "G"};
  double v = static_cast<double>(bytes);
  int u = 0;
  while (v >= 1024 && u < 3) {
    v /= 1024;
    ++u;
  }
  char buf[32];
  std::snprintf(buf, sizeof(buf), "%g%s", v, units[u]);
  return buf;
}

std::vector<uint64_t> sweepSizes(const SweepConfig& cfg) {
  std::vector<uint64_t> sizes;
  for (uint64_t s = cfg.minBytes; s <= cfg.maxBytes;) {
    sizes.push_back(s);
    uint64_t next = cfg.stepBytes > 0 ? s + cfg.stepBytes : s * cfg.stepFactor;
    if (next <= s) break;  // overflow (or -b 0 with a factor): stop, do not loop forever
    s = next;
  }
  return sizes;
}

int parseSweepArgs(int argc, char** argv, DriverInfo& info, SweepConfig* cfg) {
  for (int i = 1; i < argc; ++i) {
    std::string flag = argv[i];
    if (flag == "-h" || flag == "--help") {
      printHelp(info);
      return 0;
    }
    if (flag == "--csv") {
      cfg->csv = true;
      continue;
    }
    if (flag == "--links") {
      cfg->linksTable = true;
      continue;
    }
    if (flag == "--json") {
      cfg->json = true;
      // An optional file name: the next word unless it is another flag.
      if (i + 1 < argc && argv[i + 1][0] != '-') cfg->jsonFile = argv[++i];
      continue;
    }
    if (i + 1 >= argc) return usage(info, flag + " needs a value");
    std::string v = argv[++i];
    if (flag == "--plot") {
      cfg->plotFile = v;
      continue;
    }
    long n = 0;
    if (flag == "-b" || flag == "-e" || flag == "-i") {
      uint64_t bytes = 0;
      if (!parseSize(v, &bytes)) return usage(info, flag + " '" + v + "': expected e.g. 64K");
      (flag == "-b" ? cfg->minBytes : flag == "-e" ? cfg->maxBytes : cfg->stepBytes) = bytes;
    } else if (flag == "-f") {
      if (!parseInt(v, 2, 1 << 20, &n)) return usage(info, "-f '" + v + "': expected >= 2");
      cfg->stepFactor = static_cast<uint64_t>(n);
    } else if (flag == "-n" || flag == "-w") {
      if (!parseInt(v, flag == "-n" ? 1 : 0, 1 << 30, &n)) {
        return usage(info, flag + " '" + v + "': expected a count");
      }
      (flag == "-n" ? cfg->iters : cfg->warmup) = static_cast<int>(n);
    } else if (flag == "-c" || flag == "-m") {
      if (!parseInt(v, 0, 1, &n)) return usage(info, flag + " '" + v + "': expected 0 or 1");
      (flag == "-c" ? cfg->check : cfg->inPlace) = n == 1;
    } else if (flag == "-d") {
      cfg->dtypes.clear();
      try {
        for (const std::string& t : splitList(v)) {
          if (t == "all") {
            cfg->dtypes.assign(std::begin(kAllTypes), std::end(kAllTypes));
          } else {
            cfg->dtypes.push_back(parseDataType(t));
            if (!sweepable(cfg->dtypes.back())) {
              return usage(info, "-d: the sweep does not cover " + t);
            }
          }
        }
      } catch (const Error& e) {
        return usage(info, std::string("-d: ") + e.detail());
      }
    } else if (flag == "-o") {
      cfg->ops.clear();
      try {
        for (const std::string& o : splitList(v)) {
          if (o == "all") {
            cfg->ops.assign(std::begin(kAllOps), std::end(kAllOps));
          } else {
            cfg->ops.push_back(parseReduceOp(o));
          }
        }
      } catch (const Error& e) {
        return usage(info, std::string("-o: ") + e.detail());
      }
    } else if (flag == "-a") {
      cfg->algorithm = v;
    } else if (flag == "--op") {
      if (!parseCollective(v, &cfg->collective)) {
        return usage(info, "--op '" + v +
                               "': expected allreduce, reduce, broadcast, allgather, "
                               "reducescatter, gather, scatter, alltoall or sendrecv");
      }
    } else {
      bool known = false;
      for (ExtraFlag& f : info.extraFlags) {
        if (flag != f.name) continue;
        *f.value = v;
        known = true;
      }
      if (!known) return usage(info, "unknown option '" + flag + "'");
    }
  }
  if (cfg->minBytes > cfg->maxBytes) return usage(info, "-b is larger than -e");
  if (cfg->csv && cfg->json && cfg->jsonFile.empty()) {
    return usage(info, "--csv and --json without a file both want stdout");
  }
  if (cfg->minBytes == 0 && cfg->stepBytes == 0) {
    return usage(info, "-b 0 needs -i (a factor never grows 0)");
  }
  return -1;
}

}  // namespace gflow::bench
