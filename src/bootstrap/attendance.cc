#include "bootstrap/attendance.h"

#include <algorithm>
#include <thread>

#include "common/check.h"
#include "common/deadline.h"

namespace gflow::bootstrap {

namespace {

constexpr std::chrono::milliseconds kLongestNap{50};  // unanimous()'s polls

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

bool unanimous(Store& store, const std::string& prefix, size_t members, bool mine,
               std::chrono::milliseconds timeout) {
  if (!mine) {
    store.add(prefix + "no", 1);
    return false;
  }
  store.add(prefix + "yes", 1);
  const Deadline until = Deadline::after(timeout);
  for (auto nap = std::chrono::milliseconds(1);; nap = std::min(2 * nap, kLongestNap)) {
    if (store.add(prefix + "no", 0) > 0) return false;
    if (store.add(prefix + "yes", 0) >= static_cast<int64_t>(members)) return true;
    if (until.expired()) {
      GFLOW_THROW(kTimeout, ErrorContext::forOp("shrink"))
          << "not every member answered within " << timeout.count() << " ms (" << prefix << ")";
    }
    std::this_thread::sleep_for(std::min(nap, std::chrono::milliseconds(until.remainingMs() + 1)));
  }
}

}  // namespace gflow::bootstrap
