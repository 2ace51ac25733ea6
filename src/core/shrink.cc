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
  if (culprit >= 0 && culprit < size) dropped[culprit] = true;
  if (culprit < 0) {
    GFLOW_THROW(kInvalidArgument, ctx)
        << "shrink(): nothing names a rank to drop: "
        << (failure ? "this communicator's failure blames no rank (" +
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

std::string listRanks(const std::vector<bool>& dropped) {
  std::string s;
  for (size_t r = 0; r < dropped.size(); ++r) {
    if (dropped[r]) s += (s.empty() ? "" : ", ") + std::to_string(r);
  }
  return s;
}

}  // namespace

std::shared_ptr<Communicator> Communicator::shrink(const std::vector<int>& exclude) {
  return impl(*this).shrinkTo(exclude);
}

std::shared_ptr<Communicator> CommunicatorImpl::shrinkTo(const std::vector<int>& exclude) {
  const std::vector<bool> dropped = droppedRanks(exclude, error(), rank, size);
  if (dropped[rank]) return nullptr;
  // Whatever is still in flight here raises an error, not a half result.
  abortWith(Error(ErrorCode::kAborted,
                  "shrink() on rank " + std::to_string(rank) + " dropped rank(s) " +
                      listRanks(dropped) + " and retired this communicator",
                  ErrorContext::forOp("shrink").withRank(rank)));
  const uint64_t shrinkId = shrinkCount++;
  bootstrap::Meeting meeting{contextOptions.store, "", {}, rank, {}, timeout};
  for (int r = 0; r < size; ++r) (dropped[r] ? meeting.absent : meeting.members).push_back(r);
  meeting.members.insert(meeting.members.end(), meeting.absent.begin(), meeting.absent.end());
  std::sort(meeting.members.begin(), meeting.members.end());
  for (int attempt = 0;; ++attempt) {
    meeting.prefix = contextOptions.prefix + "shrink" + std::to_string(shrinkId) + "." +
                     std::to_string(attempt) + "/";
    const std::vector<int> members = bootstrap::attend(meeting);
    if (std::find(members.begin(), members.end(), rank) == members.end()) {
      GFLOW_LOG(WARN) << "rank " << rank << ": the other survivors counted this rank out of the "
                      << "shrunk communicator";
      return nullptr;
    }
    transport::ContextOptions co = contextOptions;
    co.rank = static_cast<int>(std::find(members.begin(), members.end(), rank) - members.begin());
    co.size = static_cast<int>(members.size());
    co.prefix = membersPrefix(meeting.prefix, members);
    try {
      return std::shared_ptr<Communicator>(connect({co, transportName, settings, hostOf[rank]}));
    } catch (const Error& e) {
      // A member lost while connecting: the next attempt's attendance counts
      // it out, with one answer for all.
      const bool lost = e.code() == ErrorCode::kTimeout || e.code() == ErrorCode::kPeerLost;
      if (!lost || attempt + 1 >= size) throw;
      GFLOW_LOG(WARN) << "rank " << rank << ": shrink attempt " << attempt
                      << " failed while the survivors connected (" << e.what() << "); again";
      meeting.members = members;
      meeting.absent.clear();
    }
  }
}

}  // namespace gflow
