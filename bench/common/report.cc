#include "common/report.h"

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

void jsonMeasurement(FILE* f, const char* name, const Measurement& m) {
  std::fprintf(f, "\"%s\": {\"time_us\": %.3f, \"algbw\": %.6f, \"busbw\": %.6f, \"wrong\": ", name,
               m.timeUs, m.algbw, m.busbw);
  if (m.wrong < 0) {
    std::fprintf(f, "null}");
  } else {
    std::fprintf(f, "%lld}", static_cast<long long>(m.wrong));
  }
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
  if (cfg_.csv) {
    std::fprintf(
        text_,
        "library,algorithm,world_size,size,count,type,redop,"
        "oop_time_us,oop_algbw,oop_busbw,oop_wrong,ip_time_us,ip_algbw,ip_busbw,ip_wrong\n");
  } else {
    std::fprintf(text_,
                 "#\n"
                 "#                                              out-of-place"
                 "                            in-place\n"
                 "#       size         count      type  redop       time   algbw   busbw  #wrong"
                 "       time   algbw   busbw  #wrong\n"
                 "#        (B)    (elements)                        (us)  (GB/s)  (GB/s)        "
                 "       (us)  (GB/s)  (GB/s)\n");
  }
  std::fflush(text_);
}

void Report::note(const std::string& text) {
  std::fprintf(meta_, "# %s\n", text.c_str());
  std::fflush(meta_);
}

void Report::add(const Row& row) {
  rows_.push_back(row);
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
  if (cfg_.csv) {
    std::string ip = row.hasInPlace ? cells(row.inPlace, true) : ",,,";
    std::fprintf(text_, "%s,%s,%d,%llu,%zu,%s,%s,%s,%s\n", info_.library.c_str(),
                 info_.algorithm.c_str(), info_.worldSize,
                 static_cast<unsigned long long>(row.bytes), row.count, toString(row.dtype),
                 toString(row.op), cells(row.outOfPlace, true).c_str(), ip.c_str());
  } else {
    std::fprintf(text_, "%12llu  %12zu  %8s  %5s%s%s\n", static_cast<unsigned long long>(row.bytes),
                 row.count, toString(row.dtype), toString(row.op),
                 cells(row.outOfPlace, true).c_str(), cells(row.inPlace, row.hasInPlace).c_str());
  }
  std::fflush(text_);
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
  std::fflush(meta_);

  if (!cfg_.json) return true;
  if (cfg_.jsonFile.empty()) {
    writeJson(stdout);
    std::fflush(stdout);
    return true;
  }
  FILE* f = std::fopen(cfg_.jsonFile.c_str(), "w");
  if (f == nullptr) {
    std::fprintf(stderr, "cannot write %s: %s\n", cfg_.jsonFile.c_str(), std::strerror(errno));
    return false;
  }
  writeJson(f);
  return std::fclose(f) == 0;
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
