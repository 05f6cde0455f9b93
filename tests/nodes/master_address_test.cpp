#include "nodes/master_address.hpp"

#include <doctest/doctest.h>

#include <string>
#include <vector>

#include "cli/cli.hpp"

using namespace gpurun::supervisor;
using Strings = std::vector<std::string>;

namespace {
const std::vector<InterfaceAddress> kHost{{"lo", "127.0.0.1"},
                                          {"lo", "::1"},
                                          {"eth0", "10.0.0.5"},
                                          {"eth0", "fd00::5"},
                                          {"eth0", "fe80::fc:ff:fe00:1"},
                                          {"ib0", "192.168.7.2"}};
}  // namespace

TEST_CASE("master address: loopback, the wildcard and interface addresses are this host") {
  CHECK(local_addresses({"127.0.0.1"}, {}) == Strings{"127.0.0.1"});
  CHECK(local_addresses({"127.0.0.2", "::1"}, {}) == Strings{"127.0.0.2", "::1"});
  CHECK(local_addresses({"0.0.0.0"}, {}) == Strings{"0.0.0.0"});
  CHECK(local_addresses({"::"}, {}) == Strings{"::"});
  CHECK(local_addresses({"10.0.0.5"}, kHost) == Strings{"10.0.0.5"});
  CHECK(local_addresses({"192.168.7.2"}, kHost) == Strings{"192.168.7.2"});
  CHECK(local_addresses({"fd00::5"}, kHost) == Strings{"fd00::5"});
  // Other spellings of the same address compare equal; the text is kept as given.
  CHECK(local_addresses({"fd00:0::0005"}, kHost) == Strings{"fd00:0::0005"});
  CHECK(local_addresses({"::ffff:10.0.0.5"}, kHost) == Strings{"::ffff:10.0.0.5"});
  // A link-local address gets its interface's scope (the store must bind it with one).
  CHECK(local_addresses({"fe80::fc:ff:fe00:1"}, kHost) == Strings{"fe80::fc:ff:fe00:1%eth0"});
  CHECK(local_addresses({"fe80::fc:ff:fe00:1%eth0"}, kHost) == Strings{"fe80::fc:ff:fe00:1%eth0"});
}

TEST_CASE("master address: addresses of other hosts are not this host") {
  CHECK(local_addresses({"192.0.2.1"}, kHost).empty());  // TEST-NET-1
  CHECK(local_addresses({"10.0.0.6"}, kHost).empty());
  CHECK(local_addresses({"fd00::6"}, kHost).empty());
  CHECK(local_addresses({"10.0.0.5"}, {}).empty());      // no interface has it
  CHECK(local_addresses({"node7", ""}, kHost).empty());  // not numeric: skipped
  // A name resolving to several addresses: only the local ones, in order, once each.
  CHECK(local_addresses({"203.0.113.9", "10.0.0.5", "fd00::5", "10.0.0.5"}, kHost) ==
        Strings{"10.0.0.5", "fd00::5"});
}

TEST_CASE("master address: the error says what the address is and lists this host's") {
  CHECK(not_this_host_reason("192.0.2.1", {"192.0.2.1"}, kHost) ==
        "node 0 hosts the store, but 192.0.2.1 is not an address of this host (lo: 127.0.0.1, "
        "::1; eth0: 10.0.0.5, fd00::5, fe80::fc:ff:fe00:1; ib0: 192.168.7.2); start node 0 "
        "(--node-rank 0) on the host this address names, or give one of this host's addresses");
  CHECK(not_this_host_reason("node7", {"10.9.0.7"}, {{"lo", "127.0.0.1"}}) ==
        "node 0 hosts the store, but it resolves to 10.9.0.7, which is not an address of this "
        "host (lo: 127.0.0.1); start node 0 (--node-rank 0) on the host this address names, or "
        "give one of this host's addresses");
  CHECK(
      not_this_host_reason("node7", {"10.9.0.7", "fd00::7"}, {})
          .find("but it resolves to 10.9.0.7, fd00::7, none of them an address of this host (none "
                "found)") != std::string::npos);
  std::vector<InterfaceAddress> many;
  for (int i = 0; i < 20; ++i)
    many.push_back({"eth" + std::to_string(i), "10.1.0." + std::to_string(i)});
  CHECK(not_this_host_reason("192.0.2.1", {"192.0.2.1"}, many).find("eth11: 10.1.0.11; 8 more)") !=
        std::string::npos);
}

TEST_CASE("master address: the store listens everywhere only with --nnodes > 1") {
  CHECK(store_listen_hosts(2, {}) == Strings{"::"});
  CHECK(store_listen_hosts(2, {"127.0.0.1"}) == Strings{"::"});
  CHECK(store_listen_hosts(4, {"10.0.0.5"}) == Strings{"::"});
  // One node: loopback for the default and for loopback addresses ...
  CHECK(store_listen_hosts(1, {}) == Strings{"127.0.0.1", "::1"});
  CHECK(store_listen_hosts(1, {"127.0.0.1"}) == Strings{"127.0.0.1", "::1"});
  CHECK(store_listen_hosts(1, {"::1", "127.0.0.1"}) == Strings{"127.0.0.1", "::1"});
  // ... else exactly the master address's local addresses, IPv4 first.
  CHECK(store_listen_hosts(1, {"127.0.0.2"}) == Strings{"127.0.0.2"});
  CHECK(store_listen_hosts(1, {"10.0.0.5"}) == Strings{"10.0.0.5"});
  CHECK(store_listen_hosts(1, {"fd00::5", "10.0.0.5"}) == Strings{"10.0.0.5", "fd00::5"});
  CHECK(store_listen_hosts(1, {"fe80::1%eth0"}) == Strings{"fe80::1%eth0"});
  CHECK(store_listen_hosts(1, {"0.0.0.0"}) == Strings{"0.0.0.0"});
}

TEST_CASE("master address: check_master_addr returns the addresses, then this host's") {
  const AddressCheck v4 = check_master_addr("127.0.0.1");
  CHECK(v4.addresses == Strings{"127.0.0.1"});
  CHECK(check_master_addr("[::1]").addresses == Strings{"::1"});
  CHECK(check_master_addr("::1").addresses == Strings{"::1"});
  CHECK(check_master_addr("192.0.2.1").addresses == Strings{"192.0.2.1"});
  CHECK(check_master_addr("nosuchhost.invalid").addresses.empty());
  // A host name: what /etc/hosts says of localhost (127.0.0.1, maybe ::1), all loopback.
  const AddressCheck name = check_master_addr("localhost");
  REQUIRE(name.result == AddressCheck::Result::kOk);
  REQUIRE_FALSE(name.addresses.empty());
  const std::vector<InterfaceAddress> mine = interface_addresses();
  CHECK(local_addresses(name.addresses, mine) == name.addresses);
  // This host's own interfaces are this host (the real getifaddrs).
  bool has_loopback = false;
  for (const InterfaceAddress& a : mine) {
    CAPTURE(a.interface);
    CAPTURE(a.address);
    CHECK(local_addresses({a.address}, mine).size() == 1);
    has_loopback = has_loopback || a.address == "127.0.0.1";
  }
  CHECK(has_loopback);
}

TEST_CASE("master address: only a single-node job whose port nobody chose may take a free one") {
  CHECK(may_take_free_port(1, false, false));
  CHECK_FALSE(may_take_free_port(1, true, false));   // --master-port, PET_MASTER_PORT, endpoint
  CHECK_FALSE(may_take_free_port(1, false, true));   // MASTER_PORT in gpurun's environment
  CHECK_FALSE(may_take_free_port(2, false, false));  // the other nodes were told the port
  CHECK(free_port_note(29500, "127.0.0.1", 41234) ==
        "port 29500 is busy; the store listens on 127.0.0.1:41234 instead (give --master-port to "
        "choose)");
  CHECK(free_port_note(29500, "::1", 41234) ==
        "port 29500 is busy; the store listens on [::1]:41234 instead (give --master-port to "
        "choose)");
}
