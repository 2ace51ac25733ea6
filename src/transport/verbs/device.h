// An opened RDMA device for one verbs context: which device, port and GID
// (GFLOW_IB_HCA, GFLOW_IB_GID_INDEX, or the NIC nearest this rank), and the
// protection domain, completion channel and completion queue the context's
// queue pairs share. Also the text that turns verbs statuses and async events
// into advice for gflow::Error messages.
#pragma once

#include <infiniband/verbs.h>

#include <cstdint>
#include <optional>
#include <string>
#include <vector>

#include "transport/verbs/verbs_api.h"

namespace gflow::transport::verbs {

// One entry of GFLOW_IB_HCA: "mlx5_0", "mlx5_0:1", "=mlx5_0" (exact name).
struct HcaEntry {
  std::string name;
  int port = -1;  // -1: any port
  bool exact = false;
};
struct HcaSpec {
  std::vector<HcaEntry> entries;  // empty: every device
  bool exclude = false;           // '^': every device but these
};

// Parses GFLOW_IB_HCA syntax; throws Error(kInvalidArgument) naming the
// variable and the bad entry.
HcaSpec parseHcaSpec(const std::string& text);
bool hcaMatches(const HcaSpec& spec, const std::string& device, int port);

// An active port of some device, as selection sees it.
struct PortCandidate {
  std::string device;
  int port = 1;
  int deviceIndex = 0;  // position in ibv_get_device_list
};

// Picks the port this rank uses: among the candidates `spec` allows, the
// first on the device named `nearest` (the NIC nearest the rank's cpus, from
// the topology; "" when unknown), else the first by device name and port.
// nullopt when none is allowed.
std::optional<PortCandidate> choosePort(const std::vector<PortCandidate>& active,
                                        const HcaSpec& spec, const std::string& nearest);

// "transport retry counter exceeded" -> what a user can check.
std::string adviceForStatus(ibv_wc_status status);

class Device {
 public:
  struct Settings {
    int rank = 0;  // for messages
    int cqEntries = 0;
    std::string hca;                  // which device and port (GFLOW_IB_HCA syntax)
    std::optional<int64_t> gidIndex;  // a GID index; nullopt: pick one (GFLOW_IB_GID_INDEX=auto)
  };
  explicit Device(const Settings& s);
  ~Device();
  Device(const Device&) = delete;
  Device& operator=(const Device&) = delete;

  const VerbsApi& api() const { return api_; }
  ibv_context* context() const { return ctx_; }
  ibv_pd* pd() const { return pd_; }
  ibv_cq* cq() const { return cq_; }
  // Grows the completion queue to hold at least `entries` (connections on
  // demand add queue pairs as peers are first used); kInvalidArgument
  // naming `what` when the device's limit is lower.
  void reserveCq(int entries, const std::string& what);
  ibv_comp_channel* channel() const { return channel_; }
  const std::string& name() const { return name_; }
  int port() const { return port_; }
  const ibv_port_attr& portAttr() const { return portAttr_; }
  const ibv_device_attr& deviceAttr() const { return devAttr_; }
  bool roce() const { return portAttr_.link_layer == IBV_LINK_LAYER_ETHERNET; }
  int gidIndex() const { return gidIndex_; }
  const ibv_gid& gid() const { return gid_; }
  // "mlx5_0 port 1 (InfiniBand, LID 3)" / "(RoCE, GID index 3 ::ffff:10.0.0.1)".
  std::string describe() const;

 private:
  // Picks the port (GFLOW_IB_HCA, else the active port nearest this
  // thread's NIC) among the `num` devices of `list` and opens its device
  // (ctx_); frees `list`. Throws gflow::Error when none is usable.
  void openPort(ibv_device** list, int num, int rank, const std::string& hca);
  // On the opened device: its attributes, GID, protection domain, event
  // channel and completion queue. Throws; the caller releases.
  void createResources(const Settings& s);
  void selectGid(int rank, std::optional<int64_t> want);
  void release();

  const VerbsApi& api_;
  ibv_context* ctx_ = nullptr;
  ibv_pd* pd_ = nullptr;
  ibv_comp_channel* channel_ = nullptr;
  ibv_cq* cq_ = nullptr;
  int cqEntries_ = 0;
  int rank_ = 0;  // for messages
  std::string name_;
  int port_ = 1;
  ibv_port_attr portAttr_{};
  ibv_device_attr devAttr_{};
  int gidIndex_ = 0;
  ibv_gid gid_{};
};

std::string formatGid(const ibv_gid& gid);

}  // namespace gflow::transport::verbs
