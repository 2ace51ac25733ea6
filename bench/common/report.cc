#include "common/report.h"

#include <spawn.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cerrno>
#include <cstring>

namespace gflow::bench {
namespace {

std::string fmt(const char* f, double v) {
  char buf[64];
  std::snprintf(buf, sizeof(buf), f, v);
  return buf;
}

std::string wrongText(int64_t wrong) {
  return wrong < 0 ? "N/A" : std::to_string(wrong);
}

void jsonList(FILE* f, const char* name, const std::vector<double>& v) {
  std::fprintf(f, "\"%s\": [", name);
  for (size_t i = 0; i < v.size(); ++i) std::fprintf(f, "%s%.1f", i ? ", " : "", v[i]);
  std::fprintf(f, "]");
}

// An n x n matrix stored row by row, as a list of rows.
template <typename T>
void jsonMatrix(FILE* f, const char* name, int n, int decimals, const std::vector<T>& m) {
  std::fprintf(f, "\"%s\": [", name);
  for (size_t r = 0; r < static_cast<size_t>(n); ++r) {
    std::fprintf(f, "%s[", r ? ", " : "");
    for (size_t c = 0; c < static_cast<size_t>(n); ++c) {
      if (c) std::fprintf(f, ", ");
      std::fprintf(f, "%.*f", decimals, static_cast<double>(m[r * static_cast<size_t>(n) + c]));
    }
    std::fprintf(f, "]");
  }
  std::fprintf(f, "]");
}

// Bytes per op: each rank's sums, then the pairs row by row (from rank).
void jsonLinks(FILE* f, const LinkBytes& l, bool above) {
  std::fprintf(f,
               ", \"links\": {\"busiest\": %.1f, \"busiest_rank\": %d, \"busiest_medium\": %s, "
               "\"busiest_direction\": %s, ",
               l.busiest, l.busiestRank, l.busiestIsNetwork ? "\"network\"" : "\"local\"",
               l.busiestIsSend ? "\"send\"" : "\"receive\"");
  std::fprintf(f, "\"busbw_above_busiest\": %s, ", above ? "true" : "false");
  jsonList(f, "network_sent", l.networkSent);
  std::fprintf(f, ", ");
  jsonList(f, "local_sent", l.localSent);
  std::fprintf(f, ", ");
  jsonList(f, "network_received", l.networkReceived);
  std::fprintf(f, ", ");
  jsonList(f, "local_received", l.localReceived);
  std::fprintf(f, ", ");
  jsonMatrix(f, "pairs", l.ranks, 1, l.pair);
  std::fprintf(f, ", ");
  jsonMatrix(f, "same_host", l.ranks, 0, l.sameHost);
  std::fprintf(f, "}");
}

void jsonMeasurement(FILE* f, const char* name, const Measurement& m) {
  std::fprintf(f, "\"%s\": {\"time_us\": %.3f, \"algbw\": %.6f, \"busbw\": %.6f, \"wrong\": ", name,
               m.timeUs, m.algbw, m.busbw);
  if (m.wrong < 0) {
    std::fprintf(f, "null");
  } else {
    std::fprintf(f, "%lld", static_cast<long long>(m.wrong));
  }
  if (m.links) jsonLinks(f, *m.links, m.busbwAboveBusiest());
  std::fprintf(f, "}");
}

// The per-link cells of a row: the out-of-place run's bytes per op, and the
// flag for either run.
std::string linkCells(const Row& row, bool csv) {
  const Measurement& m = row.outOfPlace;
  const bool above = row.busbwAboveBusiest();
  char buf[128];
  if (!m.links) {
    if (csv) return ",,,";
    std::snprintf(buf, sizeof(buf), "  %10s  %10s", "-", "-");
  } else if (csv) {
    std::snprintf(buf, sizeof(buf), ",%.0f,%.0f,%d", m.links->maxNetworkSent(),
                  m.links->maxLocalSent(), above ? 1 : 0);
  } else {
    std::snprintf(buf, sizeof(buf), "  %10.0f  %10.0f%s", m.links->maxNetworkSent(),
                  m.links->maxLocalSent(), above ? "  !" : "");
  }
  return buf;
}

// Names and values in the header and JSON are ours (library and algorithm
// names, type names), but escape quotes and backslashes anyway.
std::string jsonString(const std::string& s) {
  std::string out = "\"";
  for (char c : s) {
    if (c == '"' || c == '\\') out += '\\';
    out += c;
  }
  return out + "\"";
}

}  // namespace

Measurement makeMeasurement(uint64_t bytes, double timeUs, double busFactor) {
  Measurement m;
  m.timeUs = timeUs;
  m.algbw = timeUs > 0 ? static_cast<double>(bytes) / (timeUs * 1e3) : 0;  // bytes/us/1e3 = GB/s
  m.busbw = m.algbw * busFactor;
  return m;
}

Report::Report(const SweepConfig& cfg, RunInfo info) : cfg_(cfg), info_(std::move(info)) {
  bool jsonOnStdout = cfg_.json && cfg_.jsonFile.empty();
  text_ = jsonOnStdout ? nullptr : stdout;
  meta_ = (cfg_.csv || jsonOnStdout) ? stderr : stdout;
}

void Report::header() {
  std::fprintf(meta_, "# %s %s_bw: world size %d, algorithm %s\n", info_.library.c_str(),
               toString(cfg_.collective), info_.worldSize, info_.algorithm.c_str());
  if (!info_.extra.empty()) std::fprintf(meta_, "# %s\n", info_.extra.c_str());
  std::string step =
      cfg_.stepBytes ? "+" + formatSize(cfg_.stepBytes) : "x" + std::to_string(cfg_.stepFactor);
  std::fprintf(meta_, "# sizes %s..%s (%s), iters %d, warmup %d, check %d, in-place %d\n",
               formatSize(cfg_.minBytes).c_str(), formatSize(cfg_.maxBytes).c_str(), step.c_str(),
               cfg_.iters, cfg_.warmup, cfg_.check ? 1 : 0, cfg_.inPlace ? 1 : 0);
  if (text_ == nullptr) return;
  const bool links = info_.countsLinks;
  if (cfg_.csv) {
    std::fprintf(
        text_,
        "library,algorithm,world_size,size,count,type,redop,"
        "oop_time_us,oop_algbw,oop_busbw,oop_wrong,ip_time_us,ip_algbw,ip_busbw,ip_wrong%s\n",
        links ? ",oop_net_bytes,oop_local_bytes,busbw_above_busiest" : "");
  } else {
    std::fprintf(text_,
                 "#\n"
                 "#                                              out-of-place"
                 "                            in-place%s\n"
                 "#       size         count      type  redop       time   algbw   busbw  #wrong"
                 "       time   algbw   busbw  #wrong%s\n"
                 "#        (B)    (elements)                        (us)  (GB/s)  (GB/s)        "
                 "       (us)  (GB/s)  (GB/s)        %s\n",
                 links ? "     sent per op (out-of-place)" : "",
                 links ? "         net       local" : "", links ? "   (B, most)   (B, most)" : "");
  }
  std::fflush(text_);
}

void Report::note(const std::string& text) {
  std::fprintf(meta_, "# %s\n", text.c_str());
  std::fflush(meta_);
}

void Report::add(const Row& row) {
  rows_.push_back(row);
  flagged_ += row.busbwAboveBusiest() ? 1 : 0;
  wrong_ += std::max<int64_t>(row.outOfPlace.wrong, 0);
  if (row.hasInPlace) wrong_ += std::max<int64_t>(row.inPlace.wrong, 0);
  if (text_ == nullptr) return;

  auto cells = [&](const Measurement& m, bool present) {
    char buf[128];
    if (!present) {
      std::snprintf(buf, sizeof(buf), "  %9s  %6s  %6s  %6s", "-", "-", "-", "-");
    } else if (cfg_.csv) {
      std::snprintf(buf, sizeof(buf), "%.3f,%.4f,%.4f,%s", m.timeUs, m.algbw, m.busbw,
                    m.wrong < 0 ? "" : std::to_string(m.wrong).c_str());
    } else {
      std::snprintf(buf, sizeof(buf), "  %9s  %6.2f  %6.2f  %6s",
                    fmt(m.timeUs < 1e5 ? "%.2f" : "%.0f", m.timeUs).c_str(), m.algbw, m.busbw,
                    wrongText(m.wrong).c_str());
    }
    return std::string(buf);
  };
  const std::string links = info_.countsLinks ? linkCells(row, cfg_.csv) : "";
  if (cfg_.csv) {
    std::string ip = row.hasInPlace ? cells(row.inPlace, true) : ",,,";
    std::fprintf(text_, "%s,%s,%d,%llu,%zu,%s,%s,%s,%s%s\n", info_.library.c_str(),
                 info_.algorithm.c_str(), info_.worldSize,
                 static_cast<unsigned long long>(row.bytes), row.count, toString(row.dtype),
                 toString(row.op), cells(row.outOfPlace, true).c_str(), ip.c_str(), links.c_str());
  } else {
    std::fprintf(text_, "%12llu  %12zu  %8s  %5s%s%s%s\n",
                 static_cast<unsigned long long>(row.bytes), row.count, toString(row.dtype),
                 toString(row.op), cells(row.outOfPlace, true).c_str(),
                 cells(row.inPlace, row.hasInPlace).c_str(), links.c_str());
    if (cfg_.linksTable) pairTable(row);
  }
  std::fflush(text_);
}

void Report::pairTable(const Row& row) const {
  if (!row.outOfPlace.links) return;
  const LinkBytes& l = *row.outOfPlace.links;
  const size_t n = static_cast<size_t>(l.ranks);
  std::fprintf(text_, "#   bytes per op from rank (row) to rank (column), * same host:\n#   %6s",
               "");
  for (size_t c = 0; c < n; ++c) std::fprintf(text_, "  %10zu ", c);
  std::fprintf(text_, "\n");
  for (size_t r = 0; r < n; ++r) {
    std::fprintf(text_, "#   %6zu", r);
    for (size_t c = 0; c < n; ++c) {
      if (r == c) {
        std::fprintf(text_, "  %10s ", "-");
      } else {
        std::fprintf(text_, "  %10.0f%s", l.pair[r * n + c], l.sameHost[r * n + c] ? "*" : " ");
      }
    }
    std::fprintf(text_, "\n");
  }
}

// Like nccl-tests: the mean over every measurement, out-of-place and in-place.
double Report::avgBusbw() const {
  double sum = 0;
  int n = 0;
  for (const Row& r : rows_) {
    sum += r.outOfPlace.busbw;
    ++n;
    if (r.hasInPlace) {
      sum += r.inPlace.busbw;
      ++n;
    }
  }
  return n ? sum / n : 0.0;
}

bool Report::finish() {
  std::fprintf(meta_, "# Out of bounds values : %lld %s%s\n", static_cast<long long>(wrong_),
               wrong_ == 0 ? "OK" : "FAILED", cfg_.check ? "" : " (check disabled)");
  std::fprintf(meta_, "# Avg bus bandwidth    : %g\n", avgBusbw());
  if (info_.countsLinks && flagged_ > 0) {
    std::fprintf(meta_,
                 "# busbw above the busiest link's rate in %d row(s), marked '!': the\n"
                 "# algorithm moved less over its busiest link than busbw assumes\n",
                 flagged_);
  }
  std::fflush(meta_);

  const bool plotted = cfg_.plotFile.empty() || plot();
  if (!cfg_.json) return plotted;
  if (cfg_.jsonFile.empty()) {
    writeJson(stdout);
    std::fflush(stdout);
    return plotted;
  }
  FILE* f = std::fopen(cfg_.jsonFile.c_str(), "w");
  if (f == nullptr) {
    std::fprintf(stderr, "cannot write %s: %s\n", cfg_.jsonFile.c_str(), std::strerror(errno));
    return false;
  }
  writeJson(f);
  return std::fclose(f) == 0 && plotted;
}

// --plot: the JSON report into a temporary file, drawn by
// bench/plot_busbw.py under Debian's python3 (which has matplotlib).
bool Report::plot() const {
  char json[] = "/tmp/gflow_bw_XXXXXX";
  const int fd = mkstemp(json);
  FILE* f = fd >= 0 ? fdopen(fd, "w") : nullptr;
  if (f == nullptr) {
    std::fprintf(stderr, "--plot: cannot write a temporary file: %s\n", std::strerror(errno));
    return false;
  }
  writeJson(f);
  std::fclose(f);
  const std::string script = GFLOW_BENCH_PLOT_SCRIPT;
  std::vector<std::string> args = {"/usr/bin/python3", script, json, "--plot", cfg_.plotFile};
  std::vector<char*> argv;
  for (std::string& a : args) argv.push_back(a.data());
  argv.push_back(nullptr);
  pid_t pid = 0;
  int status = 0;
  const int err = posix_spawn(&pid, argv[0], nullptr, nullptr, argv.data(), environ);
  const bool ok =
      err == 0 && waitpid(pid, &status, 0) == pid && WIFEXITED(status) && WEXITSTATUS(status) == 0;
  unlink(json);
  if (!ok) {
    std::fprintf(stderr, "--plot: %s %s failed (%s; it needs python3-matplotlib)\n", argv[0],
                 script.c_str(), err ? std::strerror(err) : "its error is above");
    return false;
  }
  std::fprintf(meta_, "# plot: %s\n", cfg_.plotFile.c_str());
  return true;
}

void Report::writeJson(FILE* f) const {
  std::fprintf(f, "{\n  \"library\": %s,\n  \"algorithm\": %s,\n  \"world_size\": %d,\n",
               jsonString(info_.library).c_str(), jsonString(info_.algorithm).c_str(),
               info_.worldSize);
  std::fprintf(f, "  \"iters\": %d,\n  \"warmup\": %d,\n  \"check\": %s,\n  \"results\": [",
               cfg_.iters, cfg_.warmup, cfg_.check ? "true" : "false");
  for (size_t i = 0; i < rows_.size(); ++i) {
    const Row& r = rows_[i];
    std::fprintf(f,
                 "%s\n    {\"size\": %llu, \"count\": %zu, \"type\": \"%s\", \"redop\": \"%s\", ",
                 i ? "," : "", static_cast<unsigned long long>(r.bytes), r.count, toString(r.dtype),
                 toString(r.op));
    jsonMeasurement(f, "out_of_place", r.outOfPlace);
    if (r.hasInPlace) {
      std::fprintf(f, ", ");
      jsonMeasurement(f, "in_place", r.inPlace);
    }
    std::fprintf(f, "}");
  }
  std::fprintf(f, "\n  ],\n  \"avg_busbw\": %.6f,\n  \"wrong\": %lld\n}\n", avgBusbw(),
               static_cast<long long>(wrong_));
}

}  // namespace gflow::bench
