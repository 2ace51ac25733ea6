// What gflow holds in this process, counted where it is taken and given
// back: threads it started, bytes of shared memory it mapped (segments of
// the shared-memory group, local rings) and bytes it pinned (verbs memory
// registrations, CUDA pinned host memory); and the TCP store requests its
// clients made and its server answered. Communicator::stats() reports
// them (Stats::Resources); at hundreds of ranks they are what runs out.
// Thread-safe.
#pragma once

#include <cstdint>

namespace gflow::resources {

void threadStarted();
void sharedMapped(int64_t deltaBytes);  // + when mapped, - when unmapped
void pinned(int64_t deltaBytes);        // + when pinned, - when released
void storeRequestMade();                // by a TcpStore client
void storeRequestServed();              // answered by a TcpStore server

struct Counts {
  uint64_t threadsStarted = 0;  // since the process started
  uint64_t sharedBytes = 0;     // mapped now
  uint64_t pinnedBytes = 0;     // pinned now
  uint64_t storeRequests = 0;   // since the process started
  uint64_t storeServed = 0;     // since the process started
};
Counts now();

}  // namespace gflow::resources
