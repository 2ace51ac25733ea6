// The verbs functions gflow uses, as a table of function pointers.
//
// libgflow never links libibverbs: the table is filled at run time by
// dlopen("libibverbs.so.1"), so the library loads and runs (TCP, shared
// memory) on machines without rdma-core, and selecting the verbs transport
// there fails with a clear error. Tests install a table of their own (an
// in-process software device, tests/testing/soft_verbs.h) through the same
// interface, so the transport's own code runs without RDMA hardware.
//
// The types are rdma-core's (<infiniband/verbs.h>, a compile-time dependency
// only). Entries mirror the verbs of the same name; those that are inline in
// verbs.h (post_send, post_recv, poll_cq, req_notify_cq) call through the
// provider's ops in the real table.
#pragma once

#include <infiniband/verbs.h>

#include <string>

#include "common/resource_counts.h"

namespace gflow::transport::verbs {

struct VerbsApi {
  // Where the table comes from, for messages: "libibverbs.so.1 (rdma-core)".
  std::string source;

  ibv_device** (*getDeviceList)(int* num) = nullptr;
  void (*freeDeviceList)(ibv_device** list) = nullptr;
  const char* (*getDeviceName)(ibv_device* device) = nullptr;
  ibv_context* (*openDevice)(ibv_device* device) = nullptr;
  int (*closeDevice)(ibv_context* context) = nullptr;
  int (*queryDevice)(ibv_context* context, ibv_device_attr* attr) = nullptr;
  int (*queryPort)(ibv_context* context, uint8_t port, ibv_port_attr* attr) = nullptr;
  int (*queryGid)(ibv_context* context, uint8_t port, int index, ibv_gid* gid) = nullptr;

  ibv_pd* (*allocPd)(ibv_context* context) = nullptr;
  int (*deallocPd)(ibv_pd* pd) = nullptr;
  ibv_mr* (*regMr)(ibv_pd* pd, void* addr, size_t length, int access) = nullptr;
  int (*deregMr)(ibv_mr* mr) = nullptr;

  ibv_comp_channel* (*createCompChannel)(ibv_context* context) = nullptr;
  int (*destroyCompChannel)(ibv_comp_channel* channel) = nullptr;
  ibv_cq* (*createCq)(ibv_context* context, int cqe, void* cqContext, ibv_comp_channel* channel,
                      int compVector) = nullptr;
  int (*destroyCq)(ibv_cq* cq) = nullptr;
  int (*resizeCq)(ibv_cq* cq, int cqe) = nullptr;
  int (*pollCq)(ibv_cq* cq, int numEntries, ibv_wc* wc) = nullptr;
  int (*reqNotifyCq)(ibv_cq* cq, int solicitedOnly) = nullptr;
  int (*getCqEvent)(ibv_comp_channel* channel, ibv_cq** cq, void** cqContext) = nullptr;
  void (*ackCqEvents)(ibv_cq* cq, unsigned int nevents) = nullptr;

  ibv_qp* (*createQp)(ibv_pd* pd, ibv_qp_init_attr* attr) = nullptr;
  int (*modifyQp)(ibv_qp* qp, ibv_qp_attr* attr, int attrMask) = nullptr;
  int (*destroyQp)(ibv_qp* qp) = nullptr;
  int (*postSend)(ibv_qp* qp, ibv_send_wr* wr, ibv_send_wr** badWr) = nullptr;
  int (*postRecv)(ibv_qp* qp, ibv_recv_wr* wr, ibv_recv_wr** badWr) = nullptr;

  // Asynchronous events (port down, QP fatal, ...): the context's async_fd is
  // polled; getAsyncEvent is then called and must not block.
  int (*getAsyncEvent)(ibv_context* context, ibv_async_event* event) = nullptr;
  void (*ackAsyncEvent)(ibv_async_event* event) = nullptr;

  const char* (*wcStatusStr)(ibv_wc_status status) = nullptr;
  const char* (*eventTypeStr)(ibv_event_type type) = nullptr;
};

// The table in use: the one installed for testing if any, else libibverbs
// loaded on first use. Throws gflow::Error(kInvalidArgument) naming the
// library and dlerror() when libibverbs cannot be loaded or lacks a symbol.
const VerbsApi& api();

// Whether api() would succeed, without throwing; `why` gets the reason.
bool available(std::string* why);

// Replaces the table (tests). nullptr restores libibverbs. Must not be called
// while a verbs context exists.
void installApiForTesting(const VerbsApi* table);

// A memory registration through `api`, counted as pinned memory
// (common/resource_counts.h) while it lasts; null as regMr (errno set).
inline ibv_mr* pinMr(const VerbsApi& api, ibv_pd* pd, void* addr, size_t length, int access) {
  ibv_mr* mr = api.regMr(pd, addr, length, access);
  if (mr) resources::pinned(static_cast<int64_t>(length));
  return mr;
}
// Ends a registration made by pinMr of `length` bytes.
inline void unpinMr(const VerbsApi& api, ibv_mr* mr, size_t length) {
  resources::pinned(-static_cast<int64_t>(length));
  api.deregMr(mr);
}

}  // namespace gflow::transport::verbs
