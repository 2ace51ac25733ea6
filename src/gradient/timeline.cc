#include "gradient/timeline.h"

#include <cerrno>
#include <chrono>
#include <cstring>

#include "common/check.h"

namespace gflow::gradient {

std::string jsonString(const std::string& s) {
  std::string out = "\"";
  for (char c : s) {
    const auto u = static_cast<unsigned char>(c);
    if (c == '"' || c == '\\') {
      out += '\\';
      out += c;
    } else if (u < 0x20) {
      char buf[8];
      std::snprintf(buf, sizeof buf, "\\u%04x", u);
      out += buf;
    } else {
      out += c;
    }
  }
  return out + "\"";
}

std::unique_ptr<Timeline> Timeline::open(const std::string& spec, int rank) {
  if (spec.empty()) return nullptr;
  std::string path = spec;
  const size_t at = path.find("%r");
  if (at == std::string::npos) {
    if (rank != 0) return nullptr;
  } else {
    path.replace(at, 2, std::to_string(rank));
  }
  std::FILE* f = std::fopen(path.c_str(), "w");
  if (!f) {
    const int err = errno;
    GFLOW_THROW(kInvalidArgument, ErrorContext::forOp("timeline").withRank(rank))
        << "cannot create the timeline file '" << path
        << "' (GFLOW_TIMELINE): " << std::strerror(err);
  }
  std::unique_ptr<Timeline> t(new Timeline(f, rank));
  std::fputs("[\n", f);
  const std::string pid = std::to_string(rank);
  t->write("{\"name\": \"process_name\", \"ph\": \"M\", \"pid\": " + pid +
           ", \"args\": {\"name\": \"rank " + pid + "\"}}");
  const char* names[] = {"compute (ready)", "queued", "progress thread"};
  for (int tid = 0; tid < 3; ++tid) {
    t->write("{\"name\": \"thread_name\", \"ph\": \"M\", \"pid\": " + pid + ", \"tid\": " +
             std::to_string(tid) + ", \"args\": {\"name\": \"" + names[tid] + "\"}}");
  }
  return t;
}

Timeline::Timeline(std::FILE* file, int rank) : file_(file), rank_(rank) {}

Timeline::~Timeline() {
  // The last event carries no trailing comma, so the file is strict JSON.
  std::fprintf(file_,
               "{\"name\": \"end\", \"ph\": \"i\", \"s\": \"p\", \"pid\": %d, \"ts\": %lld}\n]\n",
               rank_, static_cast<long long>(nowUs()));
  std::fclose(file_);
}

int64_t Timeline::nowUs() {
  return std::chrono::duration_cast<std::chrono::microseconds>(
             std::chrono::system_clock::now().time_since_epoch())
      .count();
}

void Timeline::write(const std::string& event) {
  std::lock_guard<std::mutex> lock(mutex_);
  std::fputs(event.c_str(), file_);
  std::fputs(",\n", file_);
}

void Timeline::instant(const std::string& name, const char* category, int tid,
                       const std::string& args) {
  write("{\"name\": " + jsonString(name) + ", \"cat\": \"" + category +
        "\", \"ph\": \"i\", \"s\": \"t\", \"pid\": " + std::to_string(rank_) +
        ", \"tid\": " + std::to_string(tid) + ", \"ts\": " + std::to_string(nowUs()) +
        ", \"args\": {" + args + "}}");
}

void Timeline::span(const std::string& name, const char* category, int tid, int64_t beginUs,
                    int64_t endUs, const std::string& args) {
  write("{\"name\": " + jsonString(name) + ", \"cat\": \"" + category +
        "\", \"ph\": \"X\", \"pid\": " + std::to_string(rank_) +
        ", \"tid\": " + std::to_string(tid) + ", \"ts\": " + std::to_string(beginUs) +
        ", \"dur\": " + std::to_string(endUs - beginUs) + ", \"args\": {" + args + "}}");
}

void Timeline::flush() {
  std::lock_guard<std::mutex> lock(mutex_);
  std::fflush(file_);
}

std::string jsonArgs(SpanArgs fields) {
  std::string out;
  for (const auto& [name, value] : fields) {
    if (!out.empty()) out += ", ";
    out += jsonString(name) + ": " + std::to_string(value);
  }
  return out;
}

OpSpans::OpSpans(Timeline* timeline, std::string label, SpanArgs args)
    : timeline_(timeline), label_(std::move(label)) {
  if (timeline_) args_ = jsonArgs(args);
}

int64_t OpSpans::now() const {
  return timeline_ ? Timeline::nowUs() : 0;
}

void OpSpans::span(const char* phase, const char* category, int tid, int64_t beginUs,
                   int64_t endUs) const {
  span(phase, category, tid, beginUs, endUs, {});
}

void OpSpans::span(const char* phase, const char* category, int tid, int64_t beginUs, int64_t endUs,
                   SpanArgs more) const {
  if (!timeline_) return;
  std::string args = args_;
  if (more.size() > 0) args += (args.empty() ? "" : ", ") + jsonArgs(more);
  timeline_->span(std::string(phase) + ": " + label_, category, tid, beginUs, endUs, args);
}

}  // namespace gflow::gradient
