// address.h — which address a gloo rank listens on, from its keys:
// transport.hostname when given; else the IPv4 address of
// transport.interface when given (as GLOO_SOCKET_IFNAME names one for
// PyTorch); else, on one rank, loopback; else the first interface that is
// up and not loopback, so that ranks on other hosts can reach it with the
// same config on every host (loopback where there is none). Header-only,
// part of the gloo plugin.
#pragma once

#include <arpa/inet.h>
#include <ifaddrs.h>
#include <net/if.h>
#include <netinet/in.h>

#include <string>

namespace ddp_gloo {

// Returns the address, or "" with `error` set (an empty hostname, or an
// interface that is not there or has no IPv4 address, naming the ones that
// do).
inline std::string listen_address(const std::string& hostname, const std::string& interface, int world,
                                  std::string* error) {
  if (hostname.empty()) {
    *error = "transport.hostname is empty: give the address this rank listens on, or \"auto\"";
    return "";
  }
  if (hostname != "auto") return hostname;
  if (interface.empty() && world == 1) return "127.0.0.1";
  ifaddrs* list = nullptr;
  if (getifaddrs(&list) != 0) return "127.0.0.1";
  std::string found;
  std::string names;
  for (const ifaddrs* a = list; a && found.empty(); a = a->ifa_next) {
    if (!a->ifa_addr || a->ifa_addr->sa_family != AF_INET || !(a->ifa_flags & IFF_UP)) continue;
    char text[INET_ADDRSTRLEN] = {};
    inet_ntop(AF_INET, &reinterpret_cast<const sockaddr_in*>(a->ifa_addr)->sin_addr, text, sizeof text);
    names += (names.empty() ? "" : ", ") + std::string(a->ifa_name) + " (" + text + ")";
    if (!interface.empty() ? interface == a->ifa_name : !(a->ifa_flags & IFF_LOOPBACK)) found = text;
  }
  freeifaddrs(list);
  if (!found.empty()) return found;
  if (interface.empty()) return "127.0.0.1";
  *error = "transport.interface '" + interface + "' has no IPv4 address that is up (this host has: " + names + ")";
  return "";
}

}  // namespace ddp_gloo
