// The scheduling priority (nice value) of gflow's progress thread.
//
// A training process's compute threads (torch's intra-op threads, a second
// rank on the same cores) compete with the progress thread for the cpus.
// Under the default scheduler every runnable thread gets an equal share, so
// while the compute runs the exchange gets a fraction of a core and the link
// idles between its messages. GFLOW_PROGRESS_PRIORITY (Options::progress.
// priority) runs the progress thread that many nice levels above the thread
// that starts it (docs/configuration.md); on Linux the nice value is per
// thread. Raising it needs CAP_SYS_NICE or a RLIMIT_NICE (`ulimit -e`) that
// allows the level; lowering it never does.
#pragma once

#include <string>

namespace gflow::thread_priority {

// The nice value `levels` above `startNice` (negative levels: below),
// clamped to the kernel's range [-20, 19].
int niceAbove(int startNice, int levels);

// The calling thread's nice value.
int currentNice();

// Sets the calling thread's nice value; "" on success, else why not (the
// system's error, and what would allow it).
std::string setCurrentNice(int nice);

}  // namespace gflow::thread_priority
