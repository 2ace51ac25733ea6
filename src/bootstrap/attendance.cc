#include "bootstrap/attendance.h"

#include <algorithm>

#include "common/check.h"
#include "common/deadline.h"

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

// Member r's decision: waited for until `until`, then claimed out by this
// rank if nobody decided, then read (a winner writes right after its add).
bool decide(const Meeting& m, int r, const Deadline& until) {
  try {
    const std::chrono::milliseconds left(std::max(1, until.remainingMs()));
    return m.store->getString(decisionKey(m, r), left) == "in";
  } catch (const Error& e) {
    if (e.code() != ErrorCode::kTimeout) throw;
  }
  if (claim(m, r, false)) return false;
  return m.store->getString(decisionKey(m, r), m.timeout) == "in";
}

}  // namespace

std::vector<int> attend(const Meeting& m) {
  const ErrorContext ctx = ErrorContext::forOp("attend").withRank(m.self);
  if (!claim(m, m.self, true) && m.store->getString(decisionKey(m, m.self), m.timeout) != "in") {
    GFLOW_THROW(kTimeout, ctx.withPeer(m.self))
        << "rank " << m.self << " arrived after the other ranks' deadline (" << m.timeout.count()
        << " ms) and was counted as lost";
  }
  const Deadline until = Deadline::after(m.timeout);
  std::vector<int> present;
  for (int r : m.members) {
    if (r == m.self || decide(m, r, until)) present.push_back(r);
  }
  return present;
}

}  // namespace gflow::bootstrap
