#include "common/params.h"

#include <cerrno>
#include <cstdlib>
#include <map>
#include <mutex>

#include "gflow/error.h"

namespace gflow::params {
namespace {

std::mutex& cacheMutex() {
  static std::mutex m;
  return m;
}
std::map<std::string, std::string>& cache() {
  static std::map<std::string, std::string> c;
  return c;
}

const Param* find(const char* envName) {
  for (const Param& p : all()) {
    if (std::string(p.name) == envName) return &p;
  }
  return nullptr;
}

[[noreturn]] void bad(const char* envName, const std::string& value, const char* want) {
  throw Error(ErrorCode::kInvalidArgument,
              std::string(envName) + "='" + value + "' is not valid: expected " + want,
              ErrorContext{"config", 0, -1, -1});
}

const std::string& valueOrDefault(const char* envName, std::string* storage) {
  const std::string& v = raw(envName);
  if (!v.empty()) return v;
  const Param* p = find(envName);
  *storage = p ? p->defaultValue : "";
  return *storage;
}

}  // namespace

const std::vector<Param>& all() {
  static const std::vector<Param> params = {
#define GFLOW_PARAM_ENTRY(id, name, kind, def, doc) Param{name, Kind::kind, def, doc},
      GFLOW_PARAMS(GFLOW_PARAM_ENTRY)
#undef GFLOW_PARAM_ENTRY
  };
  return params;
}

const std::string& raw(const char* envName) {
  std::lock_guard<std::mutex> lock(cacheMutex());
  auto it = cache().find(envName);
  if (it == cache().end()) {
    const char* v = std::getenv(envName);
    it = cache().emplace(envName, v ? std::string(v) : std::string()).first;
  }
  return it->second;
}

bool isSet(const char* envName) {
  return !raw(envName).empty();
}

std::string getString(const char* envName) {
  std::string storage;
  return valueOrDefault(envName, &storage);
}

int64_t getInt(const char* envName) {
  std::string storage;
  const std::string& v = valueOrDefault(envName, &storage);
  if (v.empty()) bad(envName, v, "an integer");
  errno = 0;
  char* end = nullptr;
  long long x = std::strtoll(v.c_str(), &end, 10);
  if (errno != 0 || end == v.c_str() || *end != '\0') bad(envName, v, "an integer");
  return x;
}

bool parseBytes(const std::string& s, uint64_t* out) {
  if (s.empty()) return false;
  errno = 0;
  char* end = nullptr;
  unsigned long long x = std::strtoull(s.c_str(), &end, 10);
  if (errno != 0 || end == s.c_str() || s[0] == '-') return false;
  std::string suffix(end);
  uint64_t mul = 1;
  if (suffix.empty() || suffix == "b" || suffix == "B") {
    mul = 1;
  } else if (suffix == "k" || suffix == "K" || suffix == "KiB" || suffix == "KB") {
    mul = 1ull << 10;
  } else if (suffix == "m" || suffix == "M" || suffix == "MiB" || suffix == "MB") {
    mul = 1ull << 20;
  } else if (suffix == "g" || suffix == "G" || suffix == "GiB" || suffix == "GB") {
    mul = 1ull << 30;
  } else {
    return false;
  }
  if (x > UINT64_MAX / mul) return false;
  *out = x * mul;
  return true;
}

bool parseDurationMs(const std::string& s, int64_t* out) {
  if (s.empty()) return false;
  errno = 0;
  char* end = nullptr;
  double x = std::strtod(s.c_str(), &end);
  if (errno != 0 || end == s.c_str() || x < 0) return false;
  std::string suffix(end);
  double ms;
  if (suffix.empty() || suffix == "s") {
    ms = x * 1000.0;
  } else if (suffix == "ms") {
    ms = x;
  } else if (suffix == "m" || suffix == "min") {
    ms = x * 60000.0;
  } else if (suffix == "h") {
    ms = x * 3600000.0;
  } else {
    return false;
  }
  if (ms > 1e15) return false;
  *out = static_cast<int64_t>(ms);
  return true;
}

uint64_t getBytes(const char* envName) {
  std::string storage;
  const std::string& v = valueOrDefault(envName, &storage);
  uint64_t x = 0;
  if (!parseBytes(v, &x)) bad(envName, v, "a byte count such as 65536, 64K or 4M");
  return x;
}

int64_t getDurationMs(const char* envName) {
  std::string storage;
  const std::string& v = valueOrDefault(envName, &storage);
  int64_t x = 0;
  if (!parseDurationMs(v, &x)) bad(envName, v, "a duration such as 300, 30s, 500ms or 5m");
  return x;
}

void resetCacheForTesting() {
  std::lock_guard<std::mutex> lock(cacheMutex());
  cache().clear();
}

}  // namespace gflow::params
