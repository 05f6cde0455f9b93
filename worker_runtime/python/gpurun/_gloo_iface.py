"""Where a rank's Gloo process group listens, for a job over several hosts.

torch's ProcessGroupGloo makes its device from ``gethostname()`` unless GLOO_SOCKET_IFNAME
names an interface, and many hosts map their own name to a loopback address in /etc/hosts
(Debian: 127.0.1.1; containers: 127.0.0.1): the rank then listens on and publishes an address
that no other host reaches, and a peer on another node fails with "connect [127.0.0.1]:PORT:
Connection refused". gpurun's C++ runtime listens on this host's address routed towards
gpurun's store (worker_runtime/src/comm/gloo/communicator.cpp, gloo_listen_address); this module
gives torch the same through GLOO_SOCKET_IFNAME, for the time of the group's creation only.
"""
import contextlib
import fcntl
import ipaddress
import os
import socket
import struct

_SIOCGIFADDR = 0x8915  # <linux/sockios.h>: an interface's (first) IPv4 address


def local_address_towards(host):
    """This host's address that packets to ``host`` (a name or numeric address) leave from
    (a UDP connect: no packet is sent), as text; None when ``host`` does not resolve or has no
    route. Blocks on name resolution only."""
    try:
        infos = socket.getaddrinfo(host, 9, type=socket.SOCK_DGRAM)
    except (OSError, UnicodeError):
        return None
    for family, kind, proto, _, addr in infos:
        try:
            with socket.socket(family, kind, proto) as s:
                s.connect(addr)
                return s.getsockname()[0].split("%", 1)[0]
        except OSError:
            continue
    return None


def interface_of(address):
    """The name of this host's interface that holds ``address`` (numeric IPv4 or IPv6 text);
    None when none does. IPv4: each interface's first address (SIOCGIFADDR); IPv6:
    /proc/net/if_inet6."""
    try:
        want = ipaddress.ip_address(address)
    except ValueError:
        return None
    if want.version == 6:
        try:
            with open("/proc/net/if_inet6") as f:
                for line in f:
                    fields = line.split()
                    if len(fields) >= 6 and ipaddress.ip_address(
                            bytes.fromhex(fields[0])) == want:
                        return fields[5]
        except OSError:
            pass
        return None
    with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as s:
        for _, name in socket.if_nameindex():
            try:
                got = fcntl.ioctl(s.fileno(), _SIOCGIFADDR,
                                  struct.pack("256s", name.encode()[:15]))
            except OSError:
                continue  # no IPv4 address
            if socket.inet_ntoa(got[20:24]) == address:
                return name
    return None


def store_host():
    """gpurun's store host as this worker was given it: GPURUN_STORE_ADDR, else MASTER_ADDR."""
    return os.environ.get("GPURUN_STORE_ADDR") or os.environ.get("MASTER_ADDR")


def gloo_interface(store_host):
    """The interface a Gloo group should listen on when gpurun's store is at ``store_host``:
    the one holding this host's address towards it; None (torch's own choice) when the store is
    on loopback (a one-host job), or no such interface is found."""
    if not store_host or store_host == "localhost":
        return None
    here = local_address_towards(store_host.strip("[]"))
    if here is None or ipaddress.ip_address(here).is_loopback:
        return None
    return interface_of(here)


@contextlib.contextmanager
def listening_towards(store_host):
    """For the ``with`` body (torch's ``init_process_group``): GLOO_SOCKET_IFNAME = the
    interface of gloo_interface(``store_host``), unless the user set GLOO_SOCKET_IFNAME (theirs
    is kept) or there is none (``store_host`` None: nothing to do); the environment as it was
    afterwards."""
    name = None if os.environ.get("GLOO_SOCKET_IFNAME") else gloo_interface(store_host)
    if name is None:
        yield
        return
    os.environ["GLOO_SOCKET_IFNAME"] = name
    try:
        yield
    finally:
        os.environ.pop("GLOO_SOCKET_IFNAME", None)
