#include "topology/data_interface.h"

#include <arpa/inet.h>
#include <ifaddrs.h>
#include <netinet/in.h>

#include "common/logging.h"
#include "common/params.h"
#include "common/socket.h"

namespace gflow::topology {

std::string interfaceWithAddress(const std::string& ip) {
  ifaddrs* list = nullptr;
  if (ip.empty() || ::getifaddrs(&list) != 0) return "";
  std::string name;
  for (ifaddrs* ifa = list; ifa != nullptr && name.empty(); ifa = ifa->ifa_next) {
    if (ifa->ifa_addr == nullptr) continue;
    char buf[INET6_ADDRSTRLEN] = {0};
    const int family = ifa->ifa_addr->sa_family;
    if (family == AF_INET) {
      inet_ntop(AF_INET, &reinterpret_cast<sockaddr_in*>(ifa->ifa_addr)->sin_addr, buf,
                sizeof(buf));
    } else if (family == AF_INET6) {
      inet_ntop(AF_INET6, &reinterpret_cast<sockaddr_in6*>(ifa->ifa_addr)->sin6_addr, buf,
                sizeof(buf));
    } else {
      continue;
    }
    if (ip == buf) name = ifa->ifa_name;
  }
  ::freeifaddrs(list);
  return name;
}

std::string dataInterfaceName(const std::string& spec) {
  try {
    const std::string s = spec.empty() ? params::socketIfname() : spec;
    return interfaceWithAddress(net::selectInterfaceAddress(s));
  } catch (const std::exception& e) {
    GFLOW_LOG(DEBUG) << "topology: no data interface: " << e.what();
    return "";
  }
}

}  // namespace gflow::topology
