// Attendance: which of a list of ranks arrived at a meeting point in the
// store by a deadline, with one answer for everyone (shrink, grow).
//
// Each member's presence is decided once, by the store's atomic add on its
// claim key: the member itself claims it on arrival, and a rank that waited
// for it until the deadline claims it in the member's absence. Whoever
// claims first writes the decision ("in" or "out"), and everyone reads that
// decision, so two survivors can never disagree about a rank that arrived
// just at the deadline. A member that arrives to find itself claimed out
// is told so (kTimeout naming it); one lost between its claim and its
// decision leaves the others to time out on that decision.
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
  std::chrono::milliseconds timeout{300000};
};

// Claims this rank's presence, then waits for every member's decision
// until `timeout`; returns the members that arrived, in members' order.
// Throws kTimeout when this rank arrived after the others claimed it out,
// or when a decision never came.
std::vector<int> attend(const Meeting& m);

}  // namespace gflow::bootstrap
