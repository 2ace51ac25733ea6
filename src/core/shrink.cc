// Communicator::shrink: a new communicator over the survivors of a lost rank
// (docs/elastic.md).
//
// Who is gone needs no new agreement: the failure verdict (core/verdict.h)
// already names the same culprit on every survivor, and the caller's own
// exclusions are the same list everywhere. The members are the old ranks
// less the excluded, in order. Their store prefix carries a digest of the
// membership, so ranks that disagree about it meet in different places and
// time out instead of mixing. Each attempt first takes attendance
// (bootstrap/attendance.h): a rank lost after the verdict is counted out by
// the deadline, with one answer for all, and the members present connect.
// A rank lost while they connect fails the connection; the next attempt's
// attendance counts it out.
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

// The store prefix of one connection attempt: the shrink's number, the
// attempt and a digest of who takes part.
std::string attemptPrefix(const std::string& parent, uint64_t shrinkId, int attempt,
                          const std::vector<int>& members) {
  std::ostringstream ranks;
  for (int r : members) ranks << r << ',';
  char digest[17];
  std::snprintf(digest, sizeof(digest), "%016llx",
                static_cast<unsigned long long>(hash::sha256Id(ranks.str())));
  return parent + "shrink" + std::to_string(shrinkId) + "." + std::to_string(attempt) + "-" +
         digest + "/";
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
  std::vector<bool> dropped = droppedRanks(exclude, error(), rank, size);
  if (dropped[rank]) return nullptr;
  // Whatever is still in flight here raises an error, not a half result.
  abortWith(Error(ErrorCode::kAborted,
                  "shrink() on rank " + std::to_string(rank) + " dropped rank(s) " +
                      listRanks(dropped) + " and retired this communicator",
                  ErrorContext::forOp("shrink").withRank(rank)));
  const uint64_t shrinkId = shrinkCount++;
  for (int attempt = 0;; ++attempt) {
    std::vector<int> expected;
    for (int r = 0; r < size; ++r) {
      if (!dropped[r]) expected.push_back(r);
    }
    const std::string prefix = attemptPrefix(contextOptions.prefix, shrinkId, attempt, expected);
    const std::vector<int> members =
        bootstrap::attend({contextOptions.store, prefix + "attend/", expected, rank, timeout});
    for (int r : expected) {
      if (std::find(members.begin(), members.end(), r) == members.end()) dropped[r] = true;
    }
    transport::ContextOptions co = contextOptions;
    co.rank = static_cast<int>(std::find(members.begin(), members.end(), rank) - members.begin());
    co.size = static_cast<int>(members.size());
    co.prefix = attemptPrefix(prefix, shrinkId, attempt, members);
    try {
      return std::shared_ptr<Communicator>(connect({co, transportName, settings, hostOf[rank]}));
    } catch (const Error& e) {
      // A member lost while connecting: the next attempt's attendance finds
      // out who, with one answer for all.
      const bool lost = e.code() == ErrorCode::kTimeout || e.code() == ErrorCode::kPeerLost;
      if (!lost || attempt + 1 >= size) throw;
      GFLOW_LOG(WARN) << "rank " << rank << ": shrink attempt " << attempt
                      << " failed while the survivors connected (" << e.what() << "); again";
    }
  }
}

}  // namespace gflow
