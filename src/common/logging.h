// Logging to stderr, filtered by one process-wide level: GFLOW_DEBUG (ERROR,
// WARN, INFO, DEBUG, TRACE) until setThreshold (gflow::setLogLevel) changes it.
//   GFLOW_LOG(INFO) << "allreduce " << bytes << " bytes: ring";
// Lines look like: "gflow INFO  [pid 1234] allreduce_ring.cc:42 ...".
#pragma once

#include <sstream>

namespace gflow::log {

enum class Level { ERROR = 0, WARN = 1, INFO = 2, DEBUG = 3, TRACE = 4 };

// The level in force; thread-safe.
Level threshold();
// Replaces the level for the whole process, at once; thread-safe.
void setThreshold(Level level);
inline bool enabled(Level l) {
  return static_cast<int>(l) <= static_cast<int>(threshold());
}

class Line {
 public:
  Line(Level level, const char* file, int line);
  ~Line();
  std::ostream& stream() { return os_; }

 private:
  Level level_;
  std::ostringstream os_;
};

}  // namespace gflow::log

#define GFLOW_LOG(level)                                    \
  if (!::gflow::log::enabled(::gflow::log::Level::level)) { \
  } else                                                    \
    ::gflow::log::Line(::gflow::log::Level::level, __FILE__, __LINE__).stream()
