// Picks the address a process advertises (see net_address.h). The route rule mirrors what
// NCCL and Gloo do without an interface hint: ask the kernel which source address it would
// use toward the peer we must reach, since that is the one the peer can route back to.
#include "parallel/net_address.h"

#include <arpa/inet.h>
#include <ifaddrs.h>
#include <netdb.h>
#include <netinet/in.h>
#include <sys/socket.h>

#include <cstdlib>
#include <cstring>
#include <memory>

#include "parallel/socket_util.h"
#include "runtime/check.h"

namespace keel {
namespace {

std::string ipv4_text(const in_addr& a) {
  char buf[INET_ADDRSTRLEN] = {};
  KEEL_CHECK(::inet_ntop(AF_INET, &a, buf, sizeof(buf)) != nullptr,
             "inet_ntop: ", std::strerror(errno));
  return buf;
}

bool is_loopback_host(const std::string& host) {
  if (host == "localhost" || host == "::1") return true;
  in_addr a{};
  return ::inet_pton(AF_INET, host.c_str(), &a) == 1 && (ntohl(a.s_addr) >> 24) == 127;
}

std::string address_of_interface(const std::string& ifname) {
  std::string present;
  for (const auto& [name, addr] : ipv4_interfaces()) {
    if (name == ifname) return addr;
    present += (present.empty() ? "" : ", ") + name + " (" + addr + ")";
  }
  throw InputError(detail::concat("KEEL_IFNAME=", ifname,
                                  " names no interface with an IPv4 address; interfaces with "
                                  "IPv4 addresses here: ",
                                  present.empty() ? "none" : present));
}

std::string route_source_toward(const std::string& host) {
  addrinfo hints{};
  hints.ai_family = AF_INET;
  hints.ai_socktype = SOCK_DGRAM;
  addrinfo* res = nullptr;
  int rc = ::getaddrinfo(host.c_str(), "9", &hints, &res);
  if (rc != 0) {
    throw InputError(detail::concat("reachable_address: cannot resolve '", host,
                                    "' to an IPv4 address: ", ::gai_strerror(rc)));
  }
  std::unique_ptr<addrinfo, void (*)(addrinfo*)> owned(res, ::freeaddrinfo);
  detail::Fd fd(::socket(AF_INET, SOCK_DGRAM | SOCK_CLOEXEC, 0));
  KEEL_CHECK_ERRNO(fd.get());
  // connect() on a UDP socket only selects the route and the source address; nothing is
  // sent, so probing a peer that is down or partitioned costs nothing.
  if (::connect(fd.get(), res->ai_addr, res->ai_addrlen) != 0) {
    throw Error(detail::concat("reachable_address: no route toward ", host, ": ",
                               std::strerror(errno), " (set KEEL_IFNAME to pick an interface)"));
  }
  sockaddr_in local{};
  socklen_t len = sizeof(local);
  KEEL_CHECK_ERRNO(::getsockname(fd.get(), reinterpret_cast<sockaddr*>(&local), &len));
  return ipv4_text(local.sin_addr);
}

}  // namespace

std::vector<std::pair<std::string, std::string>> ipv4_interfaces() {
  ifaddrs* list = nullptr;
  KEEL_CHECK_ERRNO(::getifaddrs(&list));
  std::unique_ptr<ifaddrs, void (*)(ifaddrs*)> owned(list, ::freeifaddrs);
  std::vector<std::pair<std::string, std::string>> out;
  for (const ifaddrs* i = list; i; i = i->ifa_next) {
    if (i->ifa_addr == nullptr || i->ifa_addr->sa_family != AF_INET) continue;
    out.emplace_back(i->ifa_name,
                     ipv4_text(reinterpret_cast<const sockaddr_in*>(i->ifa_addr)->sin_addr));
  }
  return out;
}

std::string reachable_address(const std::string& toward_host) {
  const char* ifname = std::getenv("KEEL_IFNAME");
  if (ifname != nullptr && ifname[0] != '\0') return address_of_interface(ifname);
  if (is_loopback_host(toward_host)) return "127.0.0.1";
  return route_source_toward(toward_host);
}

}  // namespace keel
