// Communicator::shrink: a new communicator over the survivors of a lost rank
// (docs/elastic.md).
//
// Who is gone is decided by attendance (bootstrap/attendance.h), with the
// failure verdict as its hint: every survivor claims its own presence and
// the verdict's culprit (or the caller's exclusions) absent at once, and a
// rank that neither arrives nor was named is counted out at the deadline.
// Each rank's presence is decided by the first claim, so the survivors end
// with one membership even where their verdicts differ (a rank that one
// survivor blames and that claims itself in first stays; one claimed out
// first learns it and gets nullptr). In the common case, every survivor
// present and the culprit named, nothing waits for a deadline. The members
// connect under a prefix naming the attempt and a digest of the
// membership; a rank lost while they connect fails the connection, and the
// next attempt's attendance counts it out.
#include <algorithm>
#include <cstdio>
#include <sstream>

#include "bootstrap/attendance.h"
#include "common/check.h"
#include "common/hash.h"
#include "common/logging.h"
#include "core/communicator_impl.h"
#include "core/verdict.h"

namespace gflow {

namespace {

// The ranks shrink drops: `exclude`, else `failure`'s culprit. Throws kInvalidArgument for a rank
// outside the communicator, or when nothing names a rank to drop.
std::vector<bool> droppedRanks(const std::vector<int>& exclude,
                               const std::shared_ptr<const Error>& failure, int rank, int size) {
  const ErrorContext ctx = ErrorContext::forOp("shrink").withRank(rank);
  std::vector<bool> dropped(static_cast<size_t>(size), false);
  for (int r : exclude) {
    if (r < 0 || r >= size) {
      GFLOW_THROW(kInvalidArgument, ctx)
          << "shrink(): rank " << r << " in the exclusion list is outside this communicator of "
          << size << " ranks";
    }
    dropped[r] = true;
  }
  if (!exclude.empty()) return dropped;
  const int culprit = failure ? failure->peer() : -1;
  if (culprit >= 0 && culprit < size) {
    dropped[culprit] = true;
  } else {
    GFLOW_THROW(kInvalidArgument, ctx)
        << "shrink(): nothing names a rank to drop: "
        << (failure ? "this communicator's failure blames no rank of it (" +
                          std::string(failure->what()) + "); pass the ranks to exclude"
                    : "this communicator has not failed; pass the ranks to exclude");
  }
  return dropped;
}

// Where the members of one attempt connect: under the attempt's prefix, a
// digest of who takes part.
std::string membersPrefix(const std::string& attempt, const std::vector<int>& members) {
  std::ostringstream ranks;
  for (int r : members) ranks << r << ',';
  char digest[17];
  std::snprintf(digest, sizeof(digest), "%016llx",
                static_cast<unsigned long long>(hash::sha256Id(ranks.str())));
  return attempt + digest + "/";
}

}  // namespace

std::shared_ptr<Communicator> Communicator::shrink(const std::vector<int>& exclude) {
  return impl(*this).shrinkTo(exclude);
}

std::shared_ptr<Communicator> CommunicatorImpl::shrinkTo(const std::vector<int>& exclude) {
  // This communicator is left as it is: failed (what was in flight raised
  // the verdict's error), or healthy under a caller's exclusions, where an
  // abort would fail a peer still finishing the last op.
  const std::vector<bool> dropped = droppedRanks(exclude, error(), rank, size);
  if (dropped[rank]) return nullptr;
  const uint64_t shrinkId = shrinkCount++;
  bootstrap::Meeting meeting{contextOptions.store, "", {}, rank, {}, timeout};
  for (int r = 0; r < size; ++r) {
    meeting.members.push_back(r);
    if (dropped[r]) meeting.absent.push_back(r);
  }
  for (int attempt = 0;; ++attempt) {
    meeting.prefix = contextOptions.prefix + "shrink" + std::to_string(shrinkId) + "." +
                     std::to_string(attempt) + "/";
    Attempt a = shrinkAttempt(meeting);
    if (a.comm || a.countedOut) return a.comm;
    const bool lost =
        a.error->code() == ErrorCode::kTimeout || a.error->code() == ErrorCode::kPeerLost;
    if (!lost || attempt + 1 >= size) throw *a.error;
    GFLOW_LOG(WARN) << "rank " << rank << ": shrink attempt " << attempt << " did not connect ("
                    << a.error->what() << "); again";
    meeting.members = a.members;
    meeting.absent.clear();
    if (a.lost >= 0) meeting.absent.push_back(a.lost);
  }
}

CommunicatorImpl::Attempt CommunicatorImpl::shrinkAttempt(const bootstrap::Meeting& meeting) {
  Attempt a;
  try {
    a.members = bootstrap::attend(meeting);
  } catch (const Error& e) {
    throw relabel(e, ErrorContext::forOp("shrink").withRank(rank));
  }
  const auto self = std::find(a.members.begin(), a.members.end(), rank);
  if (self == a.members.end()) {
    GFLOW_LOG(WARN) << "rank " << rank << ": the other survivors counted this rank out";
    a.countedOut = true;
    return a;
  }
  transport::ContextOptions co = contextOptions;
  co.rank = static_cast<int>(self - a.members.begin());
  co.size = static_cast<int>(a.members.size());
  co.prefix = membersPrefix(meeting.prefix, a.members);
  std::shared_ptr<Communicator> comm;
  bool voted = false;  // shrinkBackend's question answered
  try {
    auto made = connect({co, transportName, settings, hostOf[rank]});
    shrinkBackend(meeting.prefix, a.members, *made, &voted);
    comm = std::shared_ptr<Communicator>(std::move(made));
  } catch (const Error& e) {
    // The others may wait for this rank's answer: a no lets them go on.
    if (!voted) voteNo(meeting.prefix);
    // The member the connection blamed, in this communicator's numbering.
    if (e.peer() >= 0 && e.peer() < co.size) a.lost = a.members[e.peer()];
    a.error = std::make_shared<Error>(
        relabel(e, ErrorContext::forOp("shrink").withRank(rank).withPeer(a.lost)));
  }
  // Whether this attempt stands is decided once: where some members
  // connected and others did not (a member lost midway), all follow the
  // first to report, so the survivors never split into two communicators.
  const std::string outcome = bootstrap::decideOnce(
      *contextOptions.store, meeting.prefix + "outcome", comm ? "commit" : "abort", timeout);
  if (outcome == "commit" && !comm) {
    GFLOW_LOG(WARN) << "rank " << rank << ": the other survivors connected without this rank ("
                    << a.error->what() << ")";
    a.countedOut = true;
  } else if (outcome == "commit") {
    a.comm = std::move(comm);
  } else if (!a.error) {
    a.error = std::make_shared<Error>(ErrorCode::kTimeout,
                                      "another survivor could not connect; trying again",
                                      ErrorContext::forOp("shrink").withRank(rank));
  }
  return a;
}

std::string CommunicatorImpl::deviceQuestion(const std::string& attempt) {
  return attempt + "device/";
}

void CommunicatorImpl::voteNo(const std::string& attempt) {
  try {
    bootstrap::unanimous(*contextOptions.store, deviceQuestion(attempt), size, false, timeout);
  } catch (const Error&) {
    // The store is gone: so are the others' answers.
  }
}

void CommunicatorImpl::shrinkBackend(const std::string& attempt, const std::vector<int>& members,
                                     CommunicatorImpl& child, bool* voted) {
  // On the executing thread, after every earlier op (none on a failed
  // communicator). Every member answers, so the members derive the part
  // together or none does (the new communicator then starts its own); with
  // nobody excluded there is nothing to shrink.
  auto task = [&] {
    executing.enter();  // a task of the executor
    std::vector<int> excluded;
    for (int r = 0; r < size; ++r) {
      if (!std::binary_search(members.begin(), members.end(), r)) excluded.push_back(r);
    }
    const bool mine = backend->canShrink() && !excluded.empty();
    *voted = true;
    if (!bootstrap::unanimous(*contextOptions.store, deviceQuestion(attempt), members.size(), mine,
                              timeout)) {
      return;
    }
    const backend::Op op{seq, backend::OpDesc{}, Deadline::after(timeout), nullptr};
    backend->shrinkInto(op, excluded, error() != nullptr, child.backend.get());
  };
  executor.submit(std::move(task), true)->wait(std::chrono::milliseconds(0));
}

}  // namespace gflow
