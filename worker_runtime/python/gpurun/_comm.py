"""A torch process group's failures, as the Python runtime handles them: which errors are a
peer's failure (``is_comm_failure``), and ``GroupLinks``, the group's own TCP connections,
closed by a rank that saw a collective fail so that its peers fail now too.

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


def tcp_connections():
    """{(fd, inode)} of this process's connected TCP sockets (IPv4 and IPv6), read from
    /proc/self/fd. Linux only; an empty set elsewhere. Non-blocking."""
    out = set()
    try:
        fds = os.listdir("/proc/self/fd")
    except OSError:
        return out
    for name in fds:
        fd = int(name)
        try:
            st = os.fstat(fd)
        except OSError:  # closed since the listing (or the listing's own descriptor)
            continue
        if not stat.S_ISSOCK(st.st_mode):
            continue
        try:
            s = socket.socket(fileno=os.dup(fd))
        except OSError:
            continue
        try:
            if s.family in (socket.AF_INET, socket.AF_INET6) and s.type == socket.SOCK_STREAM:
                s.getpeername()  # raises for a listener or an unconnected socket
                out.add((fd, st.st_ino))
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
