#include "transport/verbs/verbs_api.h"

#include <dlfcn.h>

#include <atomic>
#include <mutex>

#include "common/check.h"
#include "common/logging.h"

namespace gflow::transport::verbs {
namespace {

constexpr const char* kLibrary = "libibverbs.so.1";

// The verbs that are inline in verbs.h dispatch through the provider's ops;
// these wrappers give them addresses for the table.
int postSendInline(ibv_qp* qp, ibv_send_wr* wr, ibv_send_wr** bad) {
  return qp->context->ops.post_send(qp, wr, bad);
}
int postRecvInline(ibv_qp* qp, ibv_recv_wr* wr, ibv_recv_wr** bad) {
  return qp->context->ops.post_recv(qp, wr, bad);
}
int pollCqInline(ibv_cq* cq, int n, ibv_wc* wc) {
  return cq->context->ops.poll_cq(cq, n, wc);
}
int reqNotifyCqInline(ibv_cq* cq, int solicitedOnly) {
  return cq->context->ops.req_notify_cq(cq, solicitedOnly);
}

struct Loaded {
  VerbsApi table;
  std::string error;  // non-empty: loading failed
};

template <typename F>
bool bind(void* handle, const char* name, F* slot, std::string* error) {
  // rdma-core exports its verbs with symbol versions (IBVERBS_1.1 is the
  // current ABI of every entry used here); plain dlsym picks the default.
  void* p = dlsym(handle, name);
  if (!p) {
    *error = std::string(kLibrary) + " lacks " + name + " (" + dlerror() + ")";
    return false;
  }
  *slot = reinterpret_cast<F>(p);
  return true;
}

Loaded load() {
  Loaded out;
  void* h = dlopen(kLibrary, RTLD_NOW | RTLD_LOCAL);
  if (!h) {
    const char* e = dlerror();
    out.error = std::string("cannot load ") + kLibrary + " (" + (e ? e : "unknown error") +
                "); the verbs transport needs rdma-core's libibverbs (Debian: apt-get install "
                "libibverbs1 ibverbs-providers)";
    return out;
  }
  // Registered pages must not become copy-on-write in the parent when the
  // process forks (data loader workers): on kernels before 5.13 rdma-core
  // marks them MADV_DONTFORK after ibv_fork_init, which must come before any
  // other verb; newer kernels need nothing and it returns at once.
  using ForkInit = int (*)();
  if (auto forkInit = reinterpret_cast<ForkInit>(dlsym(h, "ibv_fork_init"))) {
    if (int rc = forkInit()) {
      GFLOW_LOG(DEBUG) << "ibv_fork_init failed (" << rc
                       << "): forking while RDMA memory is registered is unsafe on this kernel";
    }
  }
  VerbsApi& t = out.table;
  t.source = std::string(kLibrary) + " (rdma-core)";
  std::string& e = out.error;
  // ibv_query_port is a macro over an inline in verbs.h; the exported symbol
  // takes the compat attribute struct, a prefix of ibv_port_attr.
  bool ok =
      bind(h, "ibv_get_device_list", &t.getDeviceList, &e) &&
      bind(h, "ibv_free_device_list", &t.freeDeviceList, &e) &&
      bind(h, "ibv_get_device_name", &t.getDeviceName, &e) &&
      bind(h, "ibv_open_device", &t.openDevice, &e) &&
      bind(h, "ibv_close_device", &t.closeDevice, &e) &&
      bind(h, "ibv_query_device", &t.queryDevice, &e) &&
      bind(h, "ibv_query_port", &t.queryPort, &e) && bind(h, "ibv_query_gid", &t.queryGid, &e) &&
      bind(h, "ibv_alloc_pd", &t.allocPd, &e) && bind(h, "ibv_dealloc_pd", &t.deallocPd, &e) &&
      bind(h, "ibv_reg_mr", &t.regMr, &e) && bind(h, "ibv_dereg_mr", &t.deregMr, &e) &&
      bind(h, "ibv_create_comp_channel", &t.createCompChannel, &e) &&
      bind(h, "ibv_destroy_comp_channel", &t.destroyCompChannel, &e) &&
      bind(h, "ibv_create_cq", &t.createCq, &e) && bind(h, "ibv_destroy_cq", &t.destroyCq, &e) &&
      bind(h, "ibv_resize_cq", &t.resizeCq, &e) && bind(h, "ibv_get_cq_event", &t.getCqEvent, &e) &&
      bind(h, "ibv_ack_cq_events", &t.ackCqEvents, &e) &&
      bind(h, "ibv_create_qp", &t.createQp, &e) && bind(h, "ibv_modify_qp", &t.modifyQp, &e) &&
      bind(h, "ibv_destroy_qp", &t.destroyQp, &e) &&
      bind(h, "ibv_get_async_event", &t.getAsyncEvent, &e) &&
      bind(h, "ibv_ack_async_event", &t.ackAsyncEvent, &e) &&
      bind(h, "ibv_wc_status_str", &t.wcStatusStr, &e) &&
      bind(h, "ibv_event_type_str", &t.eventTypeStr, &e);
  if (!ok) {
    dlclose(h);
    return out;
  }
  t.postSend = postSendInline;
  t.postRecv = postRecvInline;
  t.pollCq = pollCqInline;
  t.reqNotifyCq = reqNotifyCqInline;
  // The handle stays open for the life of the process: providers loaded by
  // libibverbs must not be unloaded under live contexts.
  return out;
}

const Loaded& loaded() {
  static const Loaded l = load();
  return l;
}

std::atomic<const VerbsApi*> testing{nullptr};

}  // namespace

const VerbsApi& api() {
  if (const VerbsApi* t = testing.load(std::memory_order_acquire)) return *t;
  const Loaded& l = loaded();
  if (!l.error.empty()) {
    GFLOW_THROW(kInvalidArgument, ErrorContext::forOp("init"))
        << "verbs transport unavailable: " << l.error;
  }
  return l.table;
}

bool available(std::string* why) {
  if (testing.load(std::memory_order_acquire)) return true;
  const Loaded& l = loaded();
  if (why) *why = l.error;
  return l.error.empty();
}

void installApiForTesting(const VerbsApi* table) {
  testing.store(table, std::memory_order_release);
}

}  // namespace gflow::transport::verbs
