#include "bootstrap/attendance.h"

#include "common/check.h"

namespace gflow::bootstrap {

namespace {

std::string claimKey(const Meeting& m, int r) {
  return m.prefix + "claim/" + std::to_string(r);
}
std::string decisionKey(const Meeting& m, int r) {
  return m.prefix + "decision/" + std::to_string(r);
}

// Claims member r's presence (`present`: r claims itself) and, when this
// claim is the first, writes the decision. Returns whether this claim won.
bool claim(const Meeting& m, int r, bool present) {
  if (m.store->add(claimKey(m, r), 1) != 1) return false;
  m.store->setString(decisionKey(m, r), present ? "in" : "out");
  return true;
}

// Member r's decision once the deadline has passed without one: claimed
// out by this rank if nobody decided, then read (a winner writes right
// after its add).
bool decideLate(const Meeting& m, int r) {
  try {
    return m.store->getString(decisionKey(m, r), std::chrono::milliseconds(1)) == "in";
  } catch (const Error& e) {
    if (e.code() != ErrorCode::kTimeout) throw;
  }
  if (claim(m, r, false)) return false;
  return m.store->getString(decisionKey(m, r), m.timeout) == "in";
}

}  // namespace

std::vector<int> attend(const Meeting& m) {
  const bool mine = claim(m, m.self, true);
  // Before this rank may learn it is out: the others need its hints too.
  for (int r : m.absent) {
    if (r != m.self) claim(m, r, false);
  }
  if (!mine && m.store->getString(decisionKey(m, m.self), m.timeout) != "in") return {};
  std::vector<std::string> keys;
  for (int r : m.members) keys.push_back(decisionKey(m, r));
  std::vector<bool> in(m.members.size(), false);
  try {
    const auto values = m.store->multiGet(keys, m.timeout);
    for (size_t i = 0; i < values.size(); ++i) in[i] = values[i] == std::vector<uint8_t>{'i', 'n'};
  } catch (const Error& e) {
    if (e.code() != ErrorCode::kTimeout) throw;
    for (size_t i = 0; i < m.members.size(); ++i) in[i] = decideLate(m, m.members[i]);
  }
  std::vector<int> present;
  for (size_t i = 0; i < m.members.size(); ++i) {
    if (in[i]) present.push_back(m.members[i]);
  }
  return present;
}

}  // namespace gflow::bootstrap
