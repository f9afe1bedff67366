// Which IPv4 address of this machine other machines should use to reach a process here:
// every address a worker, agent or controller listens on comes from reachable_address(),
// never a hard-coded 127.0.0.1, so that a CPU job really spans machines.
#pragma once

#include <string>
#include <utility>
#include <vector>

namespace keel {

// The IPv4 address that others should use to reach this machine, chosen in this order:
//  1. env KEEL_IFNAME set and not empty: the first IPv4 address of that interface. Throws
//     keel::InputError naming KEEL_IFNAME and the interfaces that have IPv4 addresses when
//     the named one has none (or does not exist).
//  2. toward_host is a loopback address ("localhost", 127.0.0.0/8, "::1"): "127.0.0.1",
//     since everything that talks to such a host is on this machine.
//  3. otherwise: the source address the kernel picks for the route toward toward_host (a
//     UDP socket is connected to it and read back with getsockname; no packet is sent).
//     Throws keel::InputError if toward_host does not resolve to an IPv4 address, and
//     keel::Error if there is no route to it.
std::string reachable_address(const std::string& toward_host);

// Every (interface name, IPv4 address) pair of this machine's network namespace, in the
// order getifaddrs() lists them; an interface with several addresses appears once for each.
std::vector<std::pair<std::string, std::string>> ipv4_interfaces();

}  // namespace keel
