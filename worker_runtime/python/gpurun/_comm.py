"""A torch process group's sockets, as the Python runtime handles them: which errors are a
peer's failure (``is_comm_failure``); ``GroupLinks``, the group's own TCP connections,
closed by a rank that saw a collective fail so that its peers fail now too; and ``NcclWake``,
which keeps NCCL's teardown from waiting for a 500 ms poll.

Why the closing: torch's ProcessGroupGloo has no abort. A rank whose collective failed (a peer
died) leaves its connections to the other ranks open while it reports to gpurun; a live peer
blocked in a send to it or a receive from it then waits out the whole comm timeout (minutes)
before it can report, and gpurun's abort key cannot end that wait. The C++ runtime's Gloo
communicator closes all of its connections when a collective fails
(worker_runtime/src/comm/gloo/communicator.cpp, ``fail``); this does the same from Python, so
the failure spreads through the group in milliseconds (docs/control-protocol.md#failures-during-a-resize).
"""
import os
import socket
import stat

import torch.distributed as dist

# What a collective's error says when a peer died or hung (Gloo and NCCL as of torch 1.13 -
# 2.11). Only these are taken for a peer's failure: any other error is the program's own.
_COMM_FAILURE_MARKS = ("abandoned by gpurun", "Connection reset by peer",
                       "Connection closed by peer", "Broken pipe", "Connection refused",
                       "Timed out", "timed out", "NCCL error", "NCCL communicator was aborted",
                       "DistBackendError", "Socket Timeout", "failed to recv", "failed to send")


def is_comm_failure(err):
    """True when ``err`` (an exception) is a collective failing because a peer died or hung."""
    text = str(err)
    if "DataLoader" in text:  # e.g. "DataLoader timed out after 1 seconds": the data, not a peer
        return False
    network = getattr(dist, "DistNetworkError", None)  # torch >= 2.2: a store or peer socket
    if network is not None and isinstance(err, network):
        return True
    return isinstance(err, RuntimeError) and any(m in text for m in _COMM_FAILURE_MARKS)


def _own_fds():
    """This process's open descriptors (ints), read from /proc/self/fd; [] off Linux."""
    try:
        return [int(name) for name in os.listdir("/proc/self/fd")]
    except OSError:
        return []


def _own_sockets():
    """(fd, inode, duplicate) for each socket this process holds, read from /proc/self/fd
    (Linux only; nothing elsewhere). The caller closes each duplicate (closing it leaves the
    socket open)."""
    for fd in _own_fds():
        try:
            st = os.fstat(fd)
        except OSError:  # closed since the listing (or the listing's own descriptor)
            continue
        if not stat.S_ISSOCK(st.st_mode):
            continue
        try:
            blocking = os.get_blocking(fd)
            s = socket.socket(fileno=os.dup(fd))
            # With socket.setdefaulttimeout() in force CPython makes a new socket object
            # non-blocking; the duplicate shares the flag with the original: put it back.
            os.set_blocking(fd, blocking)
        except OSError:
            continue
        yield fd, st.st_ino, s


def tcp_connections():
    """{(fd, inode)} of this process's connected TCP sockets (IPv4 and IPv6), read from
    /proc/self/fd. Linux only; an empty set elsewhere. Non-blocking."""
    out = set()
    for fd, ino, s in _own_sockets():
        try:
            if s.family in (socket.AF_INET, socket.AF_INET6) and s.type == socket.SOCK_STREAM:
                s.getpeername()  # raises for a listener or an unconnected socket
                out.add((fd, ino))
        except OSError:
            pass
        finally:
            s.close()  # closes the duplicate only
    return out


class GroupLinks:
    """The TCP connections one process group opened: ``before()`` just ahead of
    ``init_process_group``, ``after()`` once it returned or raised. ``sever()`` shuts them all
    down (SHUT_RDWR: the peers read end-of-file, this rank's own pending operations on them
    fail). Only sockets that are still the same ones (descriptor and inode) are touched, so a
    descriptor reused after the group was destroyed is left alone. Sockets opened by other
    threads while the group was being set up would be counted too: call it where no other
    thread opens TCP connections (the runtime's store connections exist before)."""

    def __init__(self):
        self._before = None
        self._links = set()

    def before(self):
        self._before = tcp_connections()

    def after(self):
        if self._before is not None:
            self._links = tcp_connections() - self._before
            self._before = None

    def __len__(self):
        return len(self._links)

    def sever(self):
        """Shuts down the group's connections; returns how many. Safe to call again."""
        n = 0
        for fd, ino in self._links:
            try:
                if os.fstat(fd).st_ino != ino:
                    continue
                s = socket.socket(fileno=os.dup(fd))
            except OSError:
                continue
            try:
                s.shutdown(socket.SHUT_RDWR)  # acts on the socket, not on this duplicate
                n += 1
            except OSError:
                pass
            finally:
                s.close()
        self._links = set()
        return n

    def forget(self):
        """The group is gone (destroyed): its descriptors are not ours any more."""
        self._links = set()
        self._before = None


# NCCL's proxy UDS service socket: NCCL_IPC_SOCKNAME_STR "/tmp/nccl-socket-<rank>-<hash>"
# (src/os/linux_ipcsocket.cc), bound in the abstract namespace unless
# NCCL_IPC_USE_ABSTRACT_SOCKET=0 (then its first byte is a NUL there, not a slash).
_NCCL_UDS_NAME = "tmp/nccl-socket-"
# sizeof(struct ncclIpcHdr) (src/include/proxy.h): 4 ints, a pointer, 16 uint64.
_NCCL_IPC_HDR_BYTES = 4 * 4 + 8 + 16 * 8
_WAKE_MEMFD = "gpurun-nccl-wake"


def nccl_uds_addresses():
    """The addresses (bytes for an abstract name, else a str path) of this process's NCCL
    proxy UDS service sockets: one per NCCL proxy (communicator tree) alive. Non-blocking;
    an empty list without NCCL or off Linux."""
    out = []
    for _fd, _ino, s in _own_sockets():
        try:
            if s.family != socket.AF_UNIX or s.type != socket.SOCK_DGRAM:
                continue
            name = s.getsockname()
        except OSError:
            continue
        finally:
            s.close()
        if isinstance(name, bytes) and name[:1] == b"\0" and \
                name[1:1 + len(_NCCL_UDS_NAME)] == _NCCL_UDS_NAME.encode():
            out.append(name)
        elif isinstance(name, str) and name.startswith("/" + _NCCL_UDS_NAME):
            out.append(name)
    return out


class NcclWake:
    """Wraps torch's destroy of NCCL process groups so it does not wait for a poll tick:
    ``with NcclWake(): dist.destroy_process_group()``.

    Why: NCCL (2.19 - 2.28 at least, src/proxy.cc ``ncclProxyServiceUDS``) runs a thread per
    proxy that polls its Unix-domain socket with a 500 ms timeout and reads its stop flag only
    when the poll returns; ``ncclCommDestroy``/``ncclCommAbort`` set the flag and then join
    the thread, so a destroy waits 0 - 500 ms (~250 ms on average) for nothing
    (docs/results.md, fifth day: the Python hold park's spread). The C++ runtime does not
    wait: its non-blocking communicator is freed by NCCL's own thread.

    What it does: the socket addresses are taken on entry (only this process's own sockets,
    found in /proc/self/fd); while the body runs, a thread sends each a datagram at 5, 12, 23
    ... ms (every 50 ms at most) until its socket is gone (the NCCL thread left). A datagram
    makes the poll return: after the stop flag is set the thread exits at once; before, it
    reads a request of type 0, which NCCL does not know and skips without a message. Each
    datagram carries a descriptor of an empty memfd (NCCL expects one with every request and
    warns without it); the copies NCCL received are closed on exit. Without NCCL sockets,
    or with ``GPURUN_NCCL_WAKE=0``, it does nothing; when its set-up fails (no memfd, no
    thread) the destroy runs as it would without it. ``sent``: the datagrams sent;
    ``closed``: the received descriptors closed on exit.

    Limits: NCCL names the socket a client opens for a reply (``ncclProxyCallBlockingUDS``)
    the same way, so a cuMem handle exchange running in another thread during the destroy
    could take a wake for its reply and fail; gpurun's runtime destroys its groups from the
    training thread, with no other communicator at work. A communicator that outlives the
    destroy may keep one queued wake (one descriptor) until its own end."""

    def __init__(self):
        off = os.environ.get("GPURUN_NCCL_WAKE", "1") == "0"
        self._addrs = [] if off else nccl_uds_addresses()
        self._thread = None
        self._done = None
        self._memfd = -1
        self.sent = 0
        self.closed = 0

    def __enter__(self):
        if not self._addrs or not hasattr(os, "memfd_create"):
            return self
        import threading
        try:
            self._memfd = os.memfd_create(_WAKE_MEMFD, os.MFD_CLOEXEC)
            self._done = threading.Event()
            self._thread = threading.Thread(target=self._run, name="gpurun-nccl-wake",
                                            daemon=True)
            self._thread.start()
        except (OSError, RuntimeError):  # only a speed-up: the destroy goes on without it
            self._thread = None
            if self._memfd >= 0:
                os.close(self._memfd)
                self._memfd = -1
        return self

    def _run(self):
        import array
        hdr = bytes(_NCCL_IPC_HDR_BYTES)  # type 0: no request of NCCL's
        rights = [(socket.SOL_SOCKET, socket.SCM_RIGHTS, array.array("i", [self._memfd]))]
        left = list(self._addrs)
        delay = 0.005
        with socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM) as tx:
            tx.setblocking(False)
            while left and not self._done.wait(delay):
                for addr in list(left):
                    try:
                        tx.sendmsg([hdr], rights, 0, addr)
                        self.sent += 1
                    except BlockingIOError:  # its queue is full: it has a wake pending
                        pass
                    except OSError:  # refused or gone: NCCL's thread closed its socket
                        left.remove(addr)
                delay = min(delay * 1.5, 0.05)

    def __exit__(self, *exc):
        if self._thread is None:
            return False
        self._done.set()
        self._thread.join()
        mark = f"/memfd:{_WAKE_MEMFD} (deleted)"
        for fd in _own_fds():
            if fd == self._memfd:
                continue
            try:
                if os.readlink(f"/proc/self/fd/{fd}") == mark:
                    os.close(fd)
                    self.closed += 1
            except OSError:
                pass
        os.close(self._memfd)
        self._memfd = -1
        return False
