#include "bootstrap/attendance.h"

#include <algorithm>

#include "common/check.h"
#include "common/deadline.h"

namespace gflow::bootstrap {

namespace {

std::string decisionKey(const Meeting& m, int r) {
  return m.prefix + "decision/" + std::to_string(r);
}

// Member r's decision once the deadline `until` passed without one: claimed
// out by this rank if nobody decided, else the first claimer's (its writer
// sets it right after its add; `until` bounds the wait for one that died
// in between).
bool decideLate(const Meeting& m, int r, const Deadline& until) {
  const std::chrono::milliseconds left(std::max(1, until.remainingMs()));
  return decideOnce(*m.store, decisionKey(m, r), "out", left) == "in";
}

}  // namespace

std::string decideOnce(Store& store, const std::string& key, const std::string& mine,
                       std::chrono::milliseconds timeout) {
  if (store.add(key + "/claim", 1) == 1) {
    store.setString(key, mine);
    return mine;
  }
  return store.getString(key, timeout);
}

std::vector<int> attend(const Meeting& m) {
  const Deadline late = Deadline::after(2 * m.timeout);  // the decisions' last chance
  const bool in = decideOnce(*m.store, decisionKey(m, m.self), "in", m.timeout) == "in";
  // Before this rank may learn it is out: the others need its hints too.
  for (int r : m.absent) {
    if (r != m.self) decideOnce(*m.store, decisionKey(m, r), "out", m.timeout);
  }
  if (!in) return {};
  std::vector<std::string> keys;
  for (int r : m.members) keys.push_back(decisionKey(m, r));
  std::vector<bool> decided(m.members.size(), false);
  try {
    const auto values = m.store->multiGet(keys, m.timeout);
    for (size_t i = 0; i < values.size(); ++i) {
      decided[i] = values[i] == std::vector<uint8_t>{'i', 'n'};
    }
  } catch (const Error& e) {
    if (e.code() != ErrorCode::kTimeout) throw;
    for (size_t i = 0; i < m.members.size(); ++i) decided[i] = decideLate(m, m.members[i], late);
  }
  std::vector<int> present;
  for (size_t i = 0; i < m.members.size(); ++i) {
    if (decided[i]) present.push_back(m.members[i]);
  }
  return present;
}

bool unanimous(Store& store, const std::string& prefix, const std::vector<int>& members, int self,
               bool mine, std::chrono::milliseconds timeout) {
  store.setString(prefix + std::to_string(self), mine ? "yes" : "no");
  std::vector<std::string> keys;
  for (int r : members) keys.push_back(prefix + std::to_string(r));
  const auto values = store.multiGet(keys, timeout);
  return std::all_of(values.begin(), values.end(), [](const std::vector<uint8_t>& v) {
    return v == std::vector<uint8_t>{'y', 'e', 's'};
  });
}

}  // namespace gflow::bootstrap
