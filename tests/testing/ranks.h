// Ranks as threads: each thread creates its own Communicator over one shared
// in-memory store, so a test can run a whole world inside one process.
#pragma once

#include <functional>
#include <memory>
#include <string>
#include <vector>

#include "gflow/gflow.h"

namespace gflow::testing {

// Creates `n` communicators (one per thread, concurrently) with `base`
// options plus rank/size/store, runs fn(comm) on each rank's thread and joins.
// A gflow::Error or other exception escaping fn fails the test (with the rank).
void runRanks(int n, const std::function<void(Communicator&)>& fn, Options base = Options{});

// Like runRanks, but returns each rank's exception (nullptr when fn returned).
std::vector<std::exception_ptr> runRanksCollect(int n, const std::function<void(Communicator&)>& fn,
                                                Options base = Options{});

// Creates communicators for `n` ranks (over base.store when set, else a
// fresh in-memory store) and keeps them (for tests that reuse a
// world across many checks). Each returned communicator must be used from
// one thread per rank (see forEachRank).
std::vector<std::shared_ptr<Communicator>> makeWorld(int n, Options base = Options{});
// Like makeWorld, with each rank's options from optionsOf(rank) (rank, size
// and store are filled in).
std::vector<std::shared_ptr<Communicator>> makeWorldWith(
    int n, const std::function<Options(int)>& optionsOf);
// Options that place rank r on host hostOf[r] (GFLOW_HOST_ID per rank), so
// one process can pretend to be several hosts.
std::function<Options(int)> onHosts(std::vector<int> hostOf, Options base = Options{});

// Runs body(rank, store) on n threads over one shared in-memory store and
// returns what each thread threw (nullptr where body returned).
std::vector<std::exception_ptr> onThreads(
    int n, const std::function<void(int, const std::shared_ptr<Store>&)>& body);

// Runs body(t) on threads t = 0..n-1 and joins them; an exception escaping
// body fails the test, naming the thread. Communicators handed to
// keepUntilThreadsEnd() meanwhile live until every thread has ended (one a
// thread destroyed while a peer still finishes its last op would fail that
// peer). Not nested.
void runThreads(int n, const std::function<void(int)>& body);
void keepUntilThreadsEnd(std::shared_ptr<Communicator> c);

void forEachRank(const std::vector<std::shared_ptr<Communicator>>& world,
                 const std::function<void(Communicator&)>& fn);

// What one rank's fn raised (runRanksOutcomes).
struct Outcome {
  bool threw = false;
  ErrorCode code = ErrorCode::kInternal;
  std::string what;
  int peer = -1;
};
// Runs fn on n ranks (a 20 s timeout unless `o` sets one) and returns each
// rank's gflow::Error as an Outcome (a non-gflow exception is kInternal).
std::vector<Outcome> runRanksOutcomes(int n, const std::function<void(Communicator&)>& fn,
                                      Options o = Options{});

// Adds a test failure naming the rank for each exception in `errs`; true
// when there was none.
bool expectNoErrors(const std::vector<std::exception_ptr>& errs);

}  // namespace gflow::testing
