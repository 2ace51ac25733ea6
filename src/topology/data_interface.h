// Which network interface gflow's TCP data sockets use, by name, so the
// topology can say which NUMA node it is near (pinning, gflowrun --topology).
#pragma once

#include <string>

namespace gflow::topology {

// The name of the interface that owns `ip` ("10.0.0.5" -> "ens1f0"); "" when
// no interface has that address.
std::string interfaceWithAddress(const std::string& ip);

// The interface net::selectInterfaceAddress picks for `spec`
// (GFLOW_SOCKET_IFNAME syntax; empty: the GFLOW_SOCKET_IFNAME parameter), the
// same choice the TCP transport makes. "" when nothing matches. Never throws.
std::string dataInterfaceName(const std::string& spec = "");

}  // namespace gflow::topology
