#include "common/peer_memory.h"

#include <sys/uio.h>
#include <unistd.h>

#include <cerrno>
#include <cstring>

namespace gflow {

int readPeerMemory(pid_t pid, uint64_t remote, void* local, size_t bytes) {
  char* to = static_cast<char*>(local);
  while (bytes > 0) {
    iovec l{to, bytes};
    iovec r{reinterpret_cast<void*>(static_cast<uintptr_t>(remote)), bytes};
    const ssize_t got = ::process_vm_readv(pid, &l, 1, &r, 1, 0);
    if (got < 0 && errno == EINTR) continue;
    if (got < 0) return errno;
    // A partial read stops at an unmapped page; the next call reports it.
    if (got == 0) return EFAULT;
    to += got;
    remote += static_cast<uint64_t>(got);
    bytes -= static_cast<size_t>(got);
  }
  return 0;
}

bool ownBuffersReadable(const void* a, size_t aBytes, const void* b, size_t bBytes) {
  if (aBytes == 0 || bBytes == 0) return false;
  auto at = [](const void* p, size_t off) {
    return iovec{const_cast<char*>(static_cast<const char*>(p)) + off, 1};
  };
  iovec remote[4] = {at(a, 0), at(a, aBytes - 1), at(b, 0), at(b, bBytes - 1)};
  char sink[4];
  iovec local{sink, sizeof(sink)};
  return ::process_vm_readv(::getpid(), &local, 1, remote, 4, 0) == 4;
}

bool probePeerMemory(pid_t pid, uint64_t remote, uint64_t expect, std::string* why) {
  uint64_t got = 0;
  if (int err = readPeerMemory(pid, remote, &got, sizeof(got))) {
    *why = std::string("process_vm_readv: ") + std::strerror(err);
    return false;
  }
  if (got != expect) {
    *why = "process_vm_readv read another process (pid reused?)";
    return false;
  }
  return true;
}

}  // namespace gflow
