// The one registry of GFLOW_* parameters. Each is declared once, in
// params_table.h (accessor, name, kind, default, scope, doc), and this header
// generates a typed accessor per row: params::shm(), params::timeoutMs(), ...
// so a misspelled parameter does not compile. Values are read from the
// environment once, on first use, and cached; explicit Options fields override
// them. docs/configuration.md lists the same table (`gflowrun --print-config`
// prints it from here). Every function is thread-safe.
#pragma once

#include <cstdint>
#include <optional>
#include <string>
#include <utility>
#include <vector>

#include "common/params_table.h"

namespace gflow::params {

// kIntOrAuto / kBytesOrAuto accept the word "auto" (std::nullopt) besides a
// number, for parameters whose default is computed at run time.
enum class Kind { kString, kInt, kBytes, kDurationMs, kIntOrAuto, kBytesOrAuto };

// kAgree: every rank of a communicator must use the same value.
enum class Scope { kLocal, kAgree };

struct Param {
  const char* name;
  Kind kind;
  const char* defaultValue;
  Scope scope;
  const char* doc;
};

// One descriptor per parameter, named after its accessor: spec::shm.name is
// "GFLOW_SHM". For the few callers that need the text or whether it is set.
namespace spec {
#define GFLOW_PARAM_SPEC(id, name, kind, def, scope, doc) \
  inline constexpr Param id{name, Kind::kind, def, Scope::scope, doc};
GFLOW_PARAMS(GFLOW_PARAM_SPEC)
#undef GFLOW_PARAM_SPEC
}  // namespace spec

// All parameters in table order.
const std::vector<Param>& all();

// The accepted values of a numeric parameter (params_table.h,
// GFLOW_PARAM_RANGES): [lo, hi] in its unit, and 0 too where zeroMeansOff.
struct Range {
  int64_t lo;
  int64_t hi;
  bool zeroMeansOff;
};
// Null for a parameter without a range (the strings).
const Range* rangeOf(const Param& p);
// What a numeric parameter accepts, in words ("a byte count in [4K, 1G]");
// "" for the strings.
std::string acceptedValues(const Param& p);
// Whether `p`'s value is a secret (params_table.h, GFLOW_PARAM_SECRETS).
bool isSecret(const Param& p);
// The one way a parameter's value reaches any output (errors, logs,
// listings): a secret's as "(set, hidden)" or "(unset)", any other's as it
// is, cut after `maxChars` characters with the length said.
std::string shownValue(const Param& p, const std::string& value, size_t maxChars = 64);
// "NAME='value'" through shownValue, for messages ("NAME (set, hidden)"
// for a secret).
std::string shownAssignment(const Param& p, const std::string& value);
// Reads every numeric parameter that is set (or has a default), so a bad
// value fails at init, naming the variable and what it accepts, rather than
// at its first use deep inside an op. Communicator::create calls it.
void validateAll();

// Raw environment value ("" when unset), cached after the first read so a
// process sees one consistent configuration.
const std::string& raw(const Param& p);
bool isSet(const Param& p);
// The value, or the default when unset, as text.
std::string text(const Param& p);

// Typed values of any parameter's text (the default when unset). Each throws
// gflow::Error(kInvalidArgument) naming the variable when it does not parse.
std::string getString(const Param& p);
int64_t getInt(const Param& p);
uint64_t getBytes(const Param& p);      // accepts k/K, m/M, g/G suffixes (powers of 2)
int64_t getDurationMs(const Param& p);  // accepts ms, s, m, h; bare number = seconds
std::optional<int64_t> getIntOrAuto(const Param& p);     // "auto" -> nullopt
std::optional<uint64_t> getBytesOrAuto(const Param& p);  // "auto" -> nullopt

template <Kind K>
struct Value;
template <>
struct Value<Kind::kString> {
  static std::string get(const Param& p) { return getString(p); }
};
template <>
struct Value<Kind::kInt> {
  static int64_t get(const Param& p) { return getInt(p); }
};
template <>
struct Value<Kind::kBytes> {
  static uint64_t get(const Param& p) { return getBytes(p); }
};
template <>
struct Value<Kind::kDurationMs> {
  static int64_t get(const Param& p) { return getDurationMs(p); }
};
template <>
struct Value<Kind::kIntOrAuto> {
  static std::optional<int64_t> get(const Param& p) { return getIntOrAuto(p); }
};
template <>
struct Value<Kind::kBytesOrAuto> {
  static std::optional<uint64_t> get(const Param& p) { return getBytesOrAuto(p); }
};

// The typed accessors, one per row of params_table.h: e.g. int64_t shm(),
// int64_t timeoutMs() (milliseconds), std::optional<uint64_t> rdMaxBytes().
#define GFLOW_PARAM_ACCESSOR(id, name, kind, def, scope, doc) \
  inline auto id() {                                          \
    return Value<Kind::kind>::get(spec::id);                  \
  }
GFLOW_PARAMS(GFLOW_PARAM_ACCESSOR)
#undef GFLOW_PARAM_ACCESSOR

// What the creation-time configuration check hashes: "NAME=value\n" of every
// kAgree parameter in table order (the text, default when unset). `effective`
// replaces the value of a parameter that an explicit option overrides (e.g.
// GFLOW_ALGO by Options::algorithm).
std::string agreementDigestInput(
    const std::vector<std::pair<const Param*, std::string>>& effective = {});
// The kAgree parameter names, comma separated, for error messages.
std::string agreementNames();

// Parsers shared with command-line tools.
bool parseBytes(const std::string& s, uint64_t* out);
// "LO-HI", byte counts with parseBytes' suffixes, the half-open range
// [LO, HI); an empty LO is 0, an empty HI is UINT64_MAX ("64k-"). False
// unless LO < HI.
bool parseByteRange(const std::string& s, uint64_t* lo, uint64_t* hi);
bool parseDurationMs(const std::string& s, int64_t* out);

// For tests: forget cached values so the environment is read again.
void resetCacheForTesting();

// String-keyed lookups, for the two core files until converted
// (src/core/communicator.cc, communicator_impl.h); everything else uses the
// typed accessors above. An unknown name reads as unset with no default.
std::string getString(const char* envName);
int64_t getInt(const char* envName);
uint64_t getBytes(const char* envName);
int64_t getDurationMs(const char* envName);

}  // namespace gflow::params
