#include "core/verdict.h"

#include <algorithm>
#include <set>
#include <tuple>

#include "common/logging.h"

namespace gflow {
namespace {

// Only failures that blame another rank are settled into one verdict.
bool settles(const Error& e, int rank) {
  return (e.code() == ErrorCode::kTimeout || e.code() == ErrorCode::kPeerLost) && e.peer() >= 0 &&
         e.peer() != rank;
}

// The verdict's order over candidates: the earliest op, then the code, then
// the lowest culprit. Every rank orders the same set of candidates.
bool before(uint64_t seq, ErrorCode code, int culprit, const Error& than) {
  return std::make_tuple(seq, static_cast<int>(code), culprit) <
         std::make_tuple(than.seq(), static_cast<int>(than.code()), than.peer());
}

}  // namespace

Error relabel(const Error& e, ErrorContext ctx) {
  const ErrorContext& had = e.context();
  if (ctx.op.empty()) ctx.op = had.op;
  if (ctx.seq == 0) ctx.seq = had.seq;
  if (ctx.rank < 0) ctx.rank = had.rank;
  if (ctx.peer < 0) ctx.peer = had.peer;
  if (ctx.culprit < 0) ctx = ctx.withCulprit(had.culprit, had.reportedSeq);
  return Error(e.code(), e.detail(), std::move(ctx));
}

int blamed(const Error& e, int size) {
  const int culprit = e.context().culprit;
  return culprit >= 0 && culprit < size ? culprit : e.peer();
}

std::shared_ptr<const Error> Verdict::record(const Error& e) {
  bool first = false;
  std::shared_ptr<const Error> held = sticky_.set(e, &first);
  if (first) {
    GFLOW_LOG(INFO) << "communicator failed: " << held->what();
  }
  return held;
}

void Verdict::notifyOnce(const std::shared_ptr<const Error>& e) {
  if (!p_.backend || notified_.exchange(true)) return;
  p_.backend->abort(*e);
  p_.backend->notifyPeers(*e);
}

void Verdict::fail(const Error& e) {
  notifyOnce(record(e));
}

Error Verdict::settle(const Error& candidate) {
  if (!p_.backend || !settles(candidate, p_.rank) || error() || notified_.exchange(true)) {
    fail(candidate);  // failed before (abort(), another thread): as it was
    return candidate;
  }
  // Every peer hears this rank's candidate now, and this rank waits (for at
  // most a probe grace) for every peer's but the culprit's.
  p_.backend->abort(candidate);
  p_.backend->notifyPeers(candidate);
  const auto grace =
      std::clamp(p_.timeout / 4, std::chrono::milliseconds(50), std::chrono::milliseconds(2000));
  const Deadline until = Deadline::after(grace);
  std::vector<Error> reports = p_.backend->awaitReports(until, candidate.peer());
  // Where the peers blame another rank than this one does, the culprit's
  // own report may say it only waited for someone else: hear it too (a
  // rank that never reports holds everyone to the grace anyway).
  const bool agreed = std::all_of(reports.begin(), reports.end(), [&](const Error& r) {
    return r.context().culprit < 0 || r.context().culprit == candidate.peer();
  });
  if (!agreed) reports = p_.backend->awaitReports(until, -1);
  return *record(choose(candidate, reports));  // an abort() meanwhile stays the error of record
}

Error Verdict::choose(const Error& candidate, const std::vector<Error>& reports) const {
  auto valid = [&](const Error& r) {
    const ErrorContext& c = r.context();
    return c.culprit >= 0 && c.culprit < p_.size && c.reportedSeq != 0;
  };
  // A rank that reported is alive enough to: the blame passes on from it
  // to the ranks that never reported, where anyone blames one of those.
  std::set<int> reporters{p_.rank};
  for (const Error& r : reports) reporters.insert(r.peer());
  auto silent = [&](int culprit) { return reporters.count(culprit) == 0; };
  bool anySilent = silent(candidate.peer());
  for (const Error& r : reports) anySilent = anySilent || (valid(r) && silent(r.context().culprit));
  auto eligible = [&](int culprit) { return !anySilent || silent(culprit); };

  Error verdict = candidate;
  bool have = eligible(candidate.peer());
  for (const Error& r : reports) {
    const ErrorContext& c = r.context();
    if (!valid(r) || !eligible(c.culprit)) continue;
    if (have && !before(c.reportedSeq, r.code(), c.culprit, verdict)) continue;
    // The peer's account, then what this rank saw itself (the evidence
    // it had, e.g. the transport status, is kept).
    verdict = Error(r.code(), r.detail() + " [this rank saw: " + candidate.detail() + "]",
                    ErrorContext::forOp(candidate.op())
                        .withSeq(c.reportedSeq)
                        .withRank(p_.rank)
                        .withPeer(c.culprit)
                        .withCulprit(c.culprit, c.reportedSeq));
    have = true;
  }
  return verdict;
}

void Verdict::failAnywhere(const Error& e) {
  auto first = record(e);
  if (!p_.backend) return;
  p_.backend->abort(*first);
  // Tell the peers now if no op is running; a running op tells them when it
  // unwinds with the error.
  p_.executor->tryRunExclusive([&] { notifyOnce(first); });
}

void Verdict::reject(const Error& e, uint64_t seq) {
  if (error()) return;
  const Error numbered = relabel(e, ErrorContext::forOp(e.op()).withSeq(seq).withRank(p_.rank));
  if (!p_.backend->reject(seq, numbered.what())) fail(numbered);
}

}  // namespace gflow
