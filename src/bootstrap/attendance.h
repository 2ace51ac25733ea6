// Attendance: which of a list of ranks arrived at a meeting point in the
// store by a deadline, with one answer for everyone (shrink; grow's joiner
// tickets use decideOnce alone).
//
// Each member's presence is decided once, by the store's atomic add on its
// claim key: the member itself claims it on arrival; a rank that knows a
// member is gone (a failure verdict's culprit) claims it absent at once;
// and a rank that waited for a member until the deadline claims it absent
// then. Whoever claims first writes the decision ("in" or "out"), and
// everyone reads that decision, so two ranks can never disagree about a
// member, even one that arrived just at the deadline or one that two
// survivors' verdicts judged differently. A member that arrives to find
// itself claimed out is not among the present. One lost between its claim
// and its decision leaves the others to time out on that decision.
#pragma once

#include <chrono>
#include <memory>
#include <string>
#include <vector>

#include "gflow/store.h"

namespace gflow::bootstrap {

struct Meeting {
  std::shared_ptr<Store> store;
  std::string prefix;        // the meeting's keys live under it
  std::vector<int> members;  // the ranks expected (any numbering the caller uses)
  int self = -1;             // this rank, one of members
  std::vector<int> absent;   // members known to be gone: claimed out at once
  std::chrono::milliseconds timeout{300000};
};

// Claims this rank's presence and the absence of `absent`, then waits for
// every member's decision until `timeout` (one multi-get while all come);
// returns the members that are in, in members' order, or nothing when this
// rank was claimed out before it arrived. Throws kTimeout when a decision
// never came.
std::vector<int> attend(const Meeting& m);

// The value of `key`, decided once: `mine` when this rank's claim (the
// store's add on key + "/claim") is the first, else the first claimer's
// (waited for until `timeout`). Attendance decides each member so; shrink
// decides whether a connection attempt stands so.
std::string decideOnce(Store& store, const std::string& key, const std::string& mine,
                       std::chrono::milliseconds timeout);

// Whether every one of `members` members answers yes: this rank adds its
// answer `mine` to the store's count of yes or of no under `prefix`; a no
// returns false at once, a yes waits until every member said yes (true) or
// one said no (false), polling the counts. Each member answers once, so all
// get the same answer. Shrink asks so whether the members can derive the
// new communicator's device part. Throws kTimeout when neither came by
// `timeout`.
bool unanimous(Store& store, const std::string& prefix, size_t members, bool mine,
               std::chrono::milliseconds timeout);

}  // namespace gflow::bootstrap
