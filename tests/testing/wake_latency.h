// How late this machine wakes a thread that sleeps in epoll when another
// thread signals it. Timing tests that check a measurement gflow takes
// while ranks sleep (the straggler's skew: the stamps a waiting rank reads
// on waking err late by that much, common/arrivals.h) widen their bound by
// it. On bare metal and most VMs it is tens of microseconds; on a VM whose
// idle vcpus the host deschedules it was 0.7-0.9 ms at the 90th percentile
// and 2-4 ms at the 99th.
#pragma once

#include <cstdint>

namespace gflow::testing {

// The 95th percentile of 150 wake-ups 2 ms apart (about 0.3 s), in ns.
int64_t wakeLatencyNs();

}  // namespace gflow::testing
