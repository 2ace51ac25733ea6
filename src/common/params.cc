#include "common/params.h"

#include <cerrno>
#include <cstdlib>
#include <map>
#include <mutex>
#include <set>

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

// The registry entry of a name; an unknown name reads as unset, no default.
Param find(const char* envName) {
  for (const Param& p : all()) {
    if (std::string(p.name) == envName) return p;
  }
  return Param{envName, Kind::kString, "", Scope::kLocal, ""};
}

[[noreturn]] void bad(const Param& p, const std::string& value, const std::string& want) {
  throw Error(ErrorCode::kInvalidArgument,
              shownAssignment(p, value) + " is not valid: expected " + want,
              ErrorContext::forOp("config"));
}

// "64K", "1G" where exact, else the number.
std::string bytesText(int64_t b) {
  static const char* const kUnits[] = {"", "K", "M", "G", "T"};
  int u = 0;
  while (u < 4 && b >= 1024 && b % 1024 == 0) {
    b /= 1024;
    ++u;
  }
  return std::to_string(b) + kUnits[u];
}

std::string durationText(int64_t ms) {
  if (ms % 86400000 == 0) return std::to_string(ms / 86400000) + " days";
  if (ms % 1000 == 0) return std::to_string(ms / 1000) + "s";
  return std::to_string(ms) + "ms";
}

// What `p` accepts, for messages: `noun` with its range.
std::string accepted(const Param& p, const char* noun) {
  const Range* r = rangeOf(p);
  if (!r) return noun;
  auto show = [&](int64_t v) {
    return p.kind == Kind::kBytes || p.kind == Kind::kBytesOrAuto ? bytesText(v)
           : p.kind == Kind::kDurationMs                          ? durationText(v)
                                                                  : std::to_string(v);
  };
  std::string out = std::string(noun) + " in [" + show(r->lo) + ", " + show(r->hi) + "]";
  if (r->zeroMeansOff) out += " or 0 (off)";
  if (p.kind == Kind::kIntOrAuto || p.kind == Kind::kBytesOrAuto) out += ", or auto";
  return out;
}

// Raises unless `value` is in p's range.
void checkRange(const Param& p, const std::string& v, int64_t value, const char* noun) {
  const Range* r = rangeOf(p);
  if (!r || (value == 0 && r->zeroMeansOff)) return;
  if (value < r->lo || value > r->hi) bad(p, v, accepted(p, noun));
}

// The same for an unsigned value: every range fits int64, so one beyond it
// is out of every range.
void checkRange(const Param& p, const std::string& v, uint64_t value, const char* noun) {
  if (value > static_cast<uint64_t>(INT64_MAX) && rangeOf(p)) bad(p, v, accepted(p, noun));
  checkRange(p, v, static_cast<int64_t>(value), noun);
}

const std::string& valueOrDefault(const Param& p, std::string* storage) {
  const std::string& v = raw(p);
  if (!v.empty()) return v;
  *storage = p.defaultValue;
  return *storage;
}

bool isAuto(const Param& p) {
  std::string storage;
  return valueOrDefault(p, &storage) == "auto";
}

}  // namespace

const std::vector<Param>& all() {
  static const std::vector<Param> params = {
#define GFLOW_PARAM_ENTRY(id, name, kind, def, scope, doc) spec::id,
      GFLOW_PARAMS(GFLOW_PARAM_ENTRY)
#undef GFLOW_PARAM_ENTRY
  };
  return params;
}

std::string acceptedValues(const Param& p) {
  switch (p.kind) {
    case Kind::kString: return "";
    case Kind::kInt:
    case Kind::kIntOrAuto: return accepted(p, "an integer");
    case Kind::kBytes:
    case Kind::kBytesOrAuto: return accepted(p, "a byte count");
    case Kind::kDurationMs: return accepted(p, "a duration");
  }
  return "";
}

bool isSecret(const Param& p) {
  static const std::set<std::string> secrets = {
#define GFLOW_PARAM_SECRET(id) spec::id.name,
      GFLOW_PARAM_SECRETS(GFLOW_PARAM_SECRET)
#undef GFLOW_PARAM_SECRET
  };
  return secrets.count(p.name) > 0;
}

std::string shownValue(const Param& p, const std::string& value, size_t maxChars) {
  if (isSecret(p)) return value.empty() ? "(unset)" : "(set, hidden)";
  if (value.size() <= maxChars) return value;
  return value.substr(0, maxChars) + "... (" + std::to_string(value.size()) + " characters)";
}

std::string shownAssignment(const Param& p, const std::string& value) {
  if (isSecret(p)) return std::string(p.name) + " " + shownValue(p, value);
  return std::string(p.name) + "='" + shownValue(p, value) + "'";
}

const Range* rangeOf(const Param& p) {
  static const std::map<std::string, Range> ranges = {
#define GFLOW_PARAM_RANGE(id, lo, hi, zero) {spec::id.name, Range{lo, hi, zero}},
      GFLOW_PARAM_RANGES(GFLOW_PARAM_RANGE)
#undef GFLOW_PARAM_RANGE
  };
  auto it = ranges.find(p.name);
  return it == ranges.end() ? nullptr : &it->second;
}

void validateAll() {
  // No parameter needs more (a token, a path, an interface list): a longer
  // value is a mistake or an attack, refused before anything repeats it.
  constexpr size_t kMaxValueChars = 4096;
  for (const Param& p : all()) {
    if (raw(p).size() > kMaxValueChars) {
      bad(p, raw(p), "at most " + std::to_string(kMaxValueChars) + " characters");
    }
    if (!isSet(p) && *p.defaultValue == '\0') continue;  // unset, nothing to check
    switch (p.kind) {
      case Kind::kString: break;  // their readers check them
      case Kind::kInt: getInt(p); break;
      case Kind::kBytes: getBytes(p); break;
      case Kind::kDurationMs: getDurationMs(p); break;
      case Kind::kIntOrAuto: getIntOrAuto(p); break;
      case Kind::kBytesOrAuto: getBytesOrAuto(p); break;
    }
  }
}

const std::string& raw(const Param& p) {
  std::lock_guard<std::mutex> lock(cacheMutex());
  auto it = cache().find(p.name);
  if (it == cache().end()) {
    const char* v = std::getenv(p.name);
    it = cache().emplace(p.name, v ? std::string(v) : std::string()).first;
  }
  return it->second;
}

bool isSet(const Param& p) {
  return !raw(p).empty();
}

std::string text(const Param& p) {
  std::string storage;
  return valueOrDefault(p, &storage);
}

std::string getString(const Param& p) {
  return text(p);
}

int64_t getInt(const Param& p) {
  std::string storage;
  const std::string& v = valueOrDefault(p, &storage);
  if (v.empty()) bad(p, v, accepted(p, "an integer"));
  errno = 0;
  char* end = nullptr;
  long long x = std::strtoll(v.c_str(), &end, 10);
  if (errno != 0 || end == v.c_str() || *end != '\0') bad(p, v, accepted(p, "an integer"));
  checkRange(p, v, static_cast<int64_t>(x), "an integer");
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

bool parseByteRange(const std::string& s, uint64_t* lo, uint64_t* hi) {
  const auto dash = s.find('-');
  if (dash == std::string::npos) return false;
  const std::string los = s.substr(0, dash), his = s.substr(dash + 1);
  uint64_t l = 0, h = UINT64_MAX;
  if ((!los.empty() && !parseBytes(los, &l)) || (!his.empty() && !parseBytes(his, &h)) || l >= h) {
    return false;
  }
  *lo = l;
  *hi = h;
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

uint64_t getBytes(const Param& p) {
  std::string storage;
  const std::string& v = valueOrDefault(p, &storage);
  uint64_t x = 0;
  if (!parseBytes(v, &x)) bad(p, v, accepted(p, "a byte count (65536, 64K, 4M)"));
  checkRange(p, v, x, "a byte count");
  return x;
}

int64_t getDurationMs(const Param& p) {
  std::string storage;
  const std::string& v = valueOrDefault(p, &storage);
  int64_t x = 0;
  if (!parseDurationMs(v, &x)) bad(p, v, accepted(p, "a duration (300, 30s, 500ms, 5m)"));
  checkRange(p, v, x, "a duration");
  return x;
}

std::optional<int64_t> getIntOrAuto(const Param& p) {
  if (isAuto(p)) return std::nullopt;
  return getInt(p);
}

std::optional<uint64_t> getBytesOrAuto(const Param& p) {
  if (isAuto(p)) return std::nullopt;
  return getBytes(p);
}

std::string agreementDigestInput(
    const std::vector<std::pair<const Param*, std::string>>& effective) {
  std::string out;
  for (const Param& p : all()) {
    if (p.scope != Scope::kAgree) continue;
    std::string value = text(p);
    for (const auto& e : effective) {
      if (std::string(e.first->name) == p.name) value = e.second;
    }
    out += std::string(p.name) + "=" + value + "\n";
  }
  return out;
}

std::string agreementNames() {
  std::string out;
  for (const Param& p : all()) {
    if (p.scope != Scope::kAgree) continue;
    if (!out.empty()) out += ", ";
    out += p.name;
  }
  return out;
}

std::string getString(const char* envName) {
  return getString(find(envName));
}

int64_t getInt(const char* envName) {
  return getInt(find(envName));
}

uint64_t getBytes(const char* envName) {
  return getBytes(find(envName));
}

int64_t getDurationMs(const char* envName) {
  return getDurationMs(find(envName));
}

void resetCacheForTesting() {
  std::lock_guard<std::mutex> lock(cacheMutex());
  cache().clear();
}

}  // namespace gflow::params
