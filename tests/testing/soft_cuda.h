// A software CUDA for tests: an in-process implementation of gflow's CUDA
// component table (src/kernels/cuda/plugin.h) over host memory, so the
// device-tensor paths and the NCCL backend run in CI without a GPU. Never
// part of libgflow.
//
// install() builds the table and installs it with
// gflow::cuda::installPluginForTesting; from then on gflow::cuda::load()
// returns it. Its `nccl` entry answers the software NCCL (soft_nccl.h) once
// softnccl::enable() was called.
//
// The model:
// - Device memory is host memory. alloc(device, bytes) registers a range as
//   memory of `device`; pointerDevice answers it for any pointer inside the
//   range (and -1, returning 0, for every other pointer, hostAlloc memory
//   included).
// - Every stream (and each device's default stream, the null stream, made
//   on first use) runs its work in FIFO order on its own worker thread, so
//   work really is asynchronous to the caller. Events capture the work
//   enqueued on a stream so far, with CUDA's semantics: eventQuery answers
//   0 when it has finished and kNotReady (600) before; an event never
//   recorded counts as done; streamWaitEvent makes later work of the stream
//   wait for the captured work.
// - Multi-device rules of the CUDA programming guide: a kernel launch fails
//   (400) on a stream of another device than the current one; eventRecord
//   fails (400) when the event was created on another device than the
//   stream's; memcpyAsync, streamWaitEvent and eventQuery work across
//   devices.
// - Kernels enqueue their CPU twins (or a plain loop from the contract in
//   kernels.h). Every pointer a kernel is given must lie, with all the bytes
//   the kernel touches, in a registered allocation of the stream's device;
//   otherwise the launch returns 1 (cudaErrorInvalidValue): this catches a
//   host pointer handed to a kernel. memcpyAsync copies between any
//   pointers (cudaMemcpyDefault).
// - batchedCopy reads the host segment table when the stream reaches the
//   copy (the asynchronous copy of the contract: the table must still be
//   valid then). A segment whose src or dst is not device memory of the
//   stream's device is skipped and records an asynchronous error 700
//   (cudaErrorIllegalAddress) on the stream: from then on streamSynchronize
//   of that stream, and eventQuery of any event recorded on it once its work
//   has finished, return it (sticky, as in CUDA, but per stream). See
//   asyncErrors().
//
// Thread-safe; the current device is per thread (default 0).
#pragma once

#include <cstddef>
#include <cstdint>
#include <functional>

#include "kernels/cuda/plugin.h"

namespace gflow::testing::softcuda {

// Error codes (cudaError_t numbering), returned by the table's entries.
constexpr int kInvalidValue = 1;      // cudaErrorInvalidValue
constexpr int kMemoryAllocation = 2;  // cudaErrorMemoryAllocation
constexpr int kInvalidDevice = 101;   // cudaErrorInvalidDevice
constexpr int kInvalidHandle = 400;   // cudaErrorInvalidResourceHandle
constexpr int kNotReady = 600;        // cudaErrorNotReady (= gflow::cuda::kNotReady)
constexpr int kIllegalAddress = 700;  // cudaErrorIllegalAddress (asynchronous)

// Resets all state and counters to `devices` fake GPUs and installs the
// table (uninstalling a previous install first).
void install(int devices = 2);
// Disables the software NCCL (softnccl::disable(), which aborts every live
// communicator so no stream stays blocked in a collective), waits for every
// stream to drain, stops the workers and calls installPluginForTesting(nullptr).
// Allocations still registered stay allocated (never freed behind the
// caller's back) until the next install forgets them.
void uninstall();
// The table (static; install() makes gflow::cuda::load() return it).
const gflow::cuda::Plugin* plugin();

// Device memory: `bytes` (256-byte aligned) registered as memory of `device`.
// nullptr for a device out of range.
void* alloc(int device, size_t bytes);
// Frees an alloc() pointer (nullptr: nothing); false for any other pointer.
// Like cudaFree it first waits for the work enqueued on the device's streams.
bool free(void* p);

// The next call of table entry `entry` (its field name in gflow::cuda::Plugin,
// e.g. "eventRecord", "memcpyAsync", "narrow") returns `code` without doing
// anything. Calls queue up: failing the next two calls takes two calls. For
// "nccl", the entry returns nullptr with a reason naming the injected code.
void failNextCall(const char* entry, int code);

// Streams made by streamCreate and not yet destroyed (default streams not
// counted).
int streamsAlive();
// Kernel launches accepted (every kernel entry that enqueued work).
uint64_t kernelLaunches();
// memcpyAsync calls accepted.
uint64_t memcpys();
// hostAlloc calls that succeeded, and hostAlloc blocks not yet freed.
uint64_t hostAllocs();
int hostAllocsAlive();
// Bytes copied by memcpyAsync and batchedCopy (counted when the copy runs).
uint64_t bytesCopied();
// Asynchronous faults recorded by running work (see batchedCopy above).
uint64_t asyncErrors();
// Calls that named a stream or event after it was destroyed (and before
// the handle was handed out again): kInvalidHandle here, undefined and
// often a crash in real CUDA.
uint64_t staleHandleUses();
// alloc() ranges not yet freed.
int allocationsAlive();
// Events made by eventCreate and not yet destroyed.
int eventsAlive();
// Calls of table entry `entry` (as failNextCall names it) since install(),
// from every thread, failed ones included.
uint64_t calls(const char* entry);

// For the software NCCL and for tests.
// The calling thread's current device.
int currentDevice();
// The device of the allocation holding all of [p, p + bytes), or -1.
int deviceOf(const void* p, size_t bytes);
// Enqueues `work` on `stream` (nullptr: the default stream of `device`) as
// if it were a kernel of `device`: returns kInvalidHandle for an unknown
// stream or one of another device, else 0. `work` runs on the stream's worker
// thread in FIFO order with everything else enqueued there (events and
// streamWaitEvent see it like any other work). Not counted in kernelLaunches().
int enqueue(int device, void* stream, std::function<void()> work);

}  // namespace gflow::testing::softcuda
