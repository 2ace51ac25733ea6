#include "common/logging.h"

#include <unistd.h>

#include <atomic>
#include <cstdio>
#include <cstring>
#include <string>

#include "common/params.h"

namespace gflow::log {

namespace {

Level fromEnvironment() {
  std::string v;
  try {
    v = params::debug();
  } catch (...) {
    return Level::WARN;
  }
  for (auto& c : v) c = static_cast<char>(toupper(static_cast<unsigned char>(c)));
  if (v == "ERROR") return Level::ERROR;
  if (v == "INFO") return Level::INFO;
  if (v == "DEBUG") return Level::DEBUG;
  if (v == "TRACE") return Level::TRACE;
  return Level::WARN;
}

std::atomic<int>& current() {
  static std::atomic<int> level{static_cast<int>(fromEnvironment())};
  return level;
}

}  // namespace

Level threshold() {
  return static_cast<Level>(current().load(std::memory_order_relaxed));
}

void setThreshold(Level level) {
  current().store(static_cast<int>(level), std::memory_order_relaxed);
}

Line::Line(Level level, const char* file, int line) : level_(level) {
  static const char* names[] = {"ERROR", "WARN ", "INFO ", "DEBUG", "TRACE"};
  const char* base = std::strrchr(file, '/');
  os_ << "gflow " << names[static_cast<int>(level)] << " [pid " << getpid() << "] "
      << (base ? base + 1 : file) << ":" << line << " ";
}

Line::~Line() {
  os_ << '\n';
  std::string s = os_.str();
  // One write per line so lines of concurrent ranks do not interleave.
  ssize_t rc = ::write(STDERR_FILENO, s.data(), s.size());
  (void)rc;
  (void)level_;
}

}  // namespace gflow::log
