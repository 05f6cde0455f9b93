// Whether the master address names this host, and where node 0's store listens
// (docs/cli.md#master-address-and-where-the-store-listens). The lookup itself is
// check_master_addr (launcher/cli/cli.hpp); everything here but interface_addresses() is pure.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

namespace gpurun::supervisor {

/// One address of one of this host's network interfaces.
struct InterfaceAddress {
  std::string interface;  ///< e.g. "eth0", "lo"
  std::string address;    ///< numeric, without a scope: "10.0.0.5", "fe80::1"
};

/// This host's interface addresses, IPv4 and IPv6, of every interface (up or down), in
/// getifaddrs order. Does not block on the network. Throws gpurun::Error naming getifaddrs and
/// its errno when the list cannot be read.
std::vector<InterfaceAddress> interface_addresses();

/// Of `resolved` (numeric IPv4/IPv6 addresses, an IPv6 one possibly with "%scope"), those that
/// are this host's: loopback (127.0.0.0/8, ::1), the wildcard (0.0.0.0, ::), or an address of
/// an entry of `interfaces` (IPv4-mapped IPv6 compares as IPv4). Returned in the form the store
/// listens on: as given, except that an IPv6 link-local address without a scope gets its
/// interface's ("fe80::1%eth0"). Order of `resolved`, duplicates dropped. Text that is not a
/// numeric address is skipped.
std::vector<std::string> local_addresses(const std::vector<std::string>& resolved,
                                         const std::vector<InterfaceAddress>& interfaces);

/// The end of the error for a master address `given` (as typed) resolving to `resolved`, none
/// of them this host's, on node 0: "node 0 hosts the store, but <what> <is not / none is> an
/// address of this host (lo: 127.0.0.1, ::1; eth0: 10.0.0.5); ...". Lists at most 12 of
/// `interfaces`' addresses.
std::string not_this_host_reason(const std::string& given, const std::vector<std::string>& resolved,
                                 const std::vector<InterfaceAddress>& interfaces);

/// Where node 0's store listens (gpurun::store::ServerOptions::hosts), given the job's node
/// count and the master address's local addresses (local_addresses()):
///  - nnodes > 1: {"::"}, every interface, dual-stack (the listener falls back to 0.0.0.0
///    without IPv6): the other nodes connect from elsewhere;
///  - nnodes == 1 and `local` empty (not looked up) or only 127.0.0.1 / ::1: loopback,
///    {"127.0.0.1", "::1"} (::1 is skipped where the host has no IPv6);
///  - nnodes == 1 otherwise: exactly `local`, IPv4 first, so that a single-node job is
///    reachable at the address its workers were given and nowhere else.
std::vector<std::string> store_listen_hosts(int nnodes, const std::vector<std::string>& local);

/// Whether node 0's store may take a free port when the job's port is busy (torchrun's
/// pytorch#126510): a single-node job (nnodes 1) whose port nobody chose: no --master-port or
/// PET_MASTER_PORT, no --rdzv-endpoint (`port_given` false: Options::master_port_given) and no
/// MASTER_PORT in gpurun's environment (`master_port_env`). docs/cli.md#ports.
bool may_take_free_port(int nnodes, bool port_given, bool master_port_env);

/// The line that says so: "port 29500 is busy; the store listens on 127.0.0.1:41234 instead
/// (give --master-port to choose)". `host`: the first address the store listens on.
std::string free_port_note(uint16_t asked, const std::string& host, uint16_t bound);

/// True when a TCP listener on this host holds `port` (binding 0.0.0.0:port with SO_REUSEADDR
/// fails with EADDRINUSE): c10d's host candidate then joins the node that listens there
/// instead. Non-blocking; false on any other error.
bool port_in_use(uint16_t port);

}  // namespace gpurun::supervisor
