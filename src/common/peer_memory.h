// Single-copy reads of another local process's memory (cross-memory attach,
// process_vm_readv): the kernel copies straight from the peer's pages into
// ours, so a peer's user buffer reaches us without passing through a shared
// segment.
//
// The kernel allows it where this process may ptrace the peer: same user,
// no Yama restriction (kernel.yama.ptrace_scope 0), and a seccomp profile
// that lets process_vm_readv through. Many containers and hardened hosts
// deny it; callers probe first and keep their shared-segment path for that
// case. gflow never widens ptrace rights (no PR_SET_PTRACER) to get it.
#pragma once

#include <sys/types.h>

#include <cstddef>
#include <cstdint>
#include <string>

namespace gflow {

// Reads `bytes` at address `remote` of process `pid` into `local`, looping
// over partial reads. Returns 0, or the errno of the failing call (ESRCH:
// the process is gone; EFAULT: the range is not mapped there; EPERM: no
// right to read it).
int readPeerMemory(pid_t pid, uint64_t remote, void* local, size_t bytes);

// True when the first and last byte of both buffers of this process can be
// read this way. Memory the kernel cannot pin (mappings of device memory,
// VM_IO/VM_PFNMAP regions that drivers hand out) fails; a buffer lies in
// one such mapping as a whole, so its ends stand for it. One system call.
bool ownBuffersReadable(const void* a, size_t aBytes, const void* b, size_t bBytes);

// True when process `pid` can be read this way and holds `expect` (8 bytes)
// at `remote`, which ties the pid to the process that published the address
// (a reused pid cannot pass). Sets *why otherwise.
bool probePeerMemory(pid_t pid, uint64_t remote, uint64_t expect, std::string* why);

}  // namespace gflow
