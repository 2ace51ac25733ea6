// Timeline: a Chrome trace (chrome://tracing, Perfetto) of the gradient
// pipeline, like Horovod's: when each tensor became ready, when its bucket
// was queued, packed, reduced and unpacked. One JSON array of trace events;
// timestamps are wall-clock microseconds so files of several ranks line up.
#pragma once

#include <cstdint>
#include <cstdio>
#include <initializer_list>
#include <memory>
#include <mutex>
#include <string>
#include <utility>

namespace gflow::gradient {

class Timeline {
 public:
  // Threads ("tid") of one rank's trace.
  static constexpr int kCompute = 0;  // ready() calls and wait()
  static constexpr int kQueue = 1;    // fired, waiting for the progress thread
  static constexpr int kComm = 2;     // pack, allreduce, unpack

  // The timeline for `spec` (a file name; "%r" becomes the rank, without it
  // only rank 0 writes), or nullptr when spec is empty or this rank does not
  // write. Throws gflow::Error(kInvalidArgument) when the file cannot be
  // created.
  static std::unique_ptr<Timeline> open(const std::string& spec, int rank);
  ~Timeline();  // writes the closing bracket

  static int64_t nowUs();
  // `args` is a JSON object body without braces ("\"bytes\": 12"), or "".
  void instant(const std::string& name, const char* category, int tid, const std::string& args);
  void span(const std::string& name, const char* category, int tid, int64_t beginUs, int64_t endUs,
            const std::string& args);
  void flush();

 private:
  Timeline(std::FILE* file, int rank);
  void write(const std::string& event);

  std::mutex mutex_;
  std::FILE* file_;
  int rank_;
};

// `s` as a JSON string literal (quotes included).
std::string jsonString(const std::string& s);
// Named integer fields as an `args` body: {{"step", 3}} -> "\"step\": 3".
using SpanArgs = std::initializer_list<std::pair<const char*, uint64_t>>;
std::string jsonArgs(SpanArgs fields);

// The spans of one fired op, all on one timeline with one label and one set
// of args: span("pack", ...) records "pack: <label>". Every call is a no-op
// without a timeline, so callers record phases unconditionally. Immutable
// after construction: shared by the op's steps on any thread.
class OpSpans {
 public:
  // `args`: named integer fields of every span ({"step", 3}, ...).
  OpSpans(Timeline* timeline, std::string label, SpanArgs args);
  // Timeline::nowUs(), or 0 without a timeline.
  int64_t now() const;
  void span(const char* phase, const char* category, int tid, int64_t beginUs, int64_t endUs) const;
  // With more named integer fields after the op's own.
  void span(const char* phase, const char* category, int tid, int64_t beginUs, int64_t endUs,
            SpanArgs more) const;
  bool on() const { return timeline_ != nullptr; }

 private:
  Timeline* timeline_;
  std::string label_;
  std::string args_;
};

}  // namespace gflow::gradient
