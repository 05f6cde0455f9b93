"""A blocking client of gpurun's store (torch's TCPStore wire protocol, torch 2.x dialect).

Pure Python, so the control protocol does not depend on the torch version's TCPStore binding
(keys are sent raw, as gpurun's C++ runtime sends them: no "/" prefix). One connection, one
request at a time; not thread-safe. Errors: ``StoreError`` naming host:port.
docs/store-protocol.md has the wire format.
"""
import os
import socket
import struct
import time

_VALIDATE, _SET, _GET, _ADD, _CHECK, _WAIT, _DELETE_KEY, _CANCEL_WAIT, _PING = (
    0, 1, 3, 4, 5, 6, 8, 12, 13)
_MAGIC = 0x3C85F7CE


class StoreError(RuntimeError):
    """The store connection failed or answered outside the protocol."""


class StoreTimeout(StoreError):
    """A wait ran past its timeout (the connection stays usable)."""


def _bytes(v):
    b = v if isinstance(v, (bytes, bytearray)) else str(v).encode()
    return struct.pack("<Q", len(b)) + b


class StoreClient:
    """Connects to ``host:port`` with retries until ``connect_timeout_s`` (s), then sends
    VALIDATE + PING (pid) and checks the echo. Raises StoreError naming host:port."""

    def __init__(self, host, port, connect_timeout_s=60.0):
        self.where = f"{host}:{port}"
        deadline = time.monotonic() + connect_timeout_s
        delay, attempts = 0.05, 0
        while True:
            attempts += 1
            try:
                self._sock = socket.create_connection((host, int(port)), timeout=10)
                break
            except OSError as e:
                if time.monotonic() + delay > deadline:
                    raise StoreError(f"cannot connect to gpurun's store at {self.where} "
                                     f"after {attempts} attempts: {e}") from e
                time.sleep(delay)
                delay = min(delay * 1.5, 2.0)
        self._sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        self._sock.settimeout(None)
        nonce = os.getpid() & 0xFFFFFFFF
        self._send(struct.pack("<BI", _VALIDATE, _MAGIC) + struct.pack("<BI", _PING, nonce))
        if struct.unpack("<I", self._recv(4))[0] != nonce:
            raise StoreError(f"store at {self.where}: PING echo does not match")

    def _send(self, data):
        try:
            self._sock.sendall(data)
        except OSError as e:
            raise StoreError(f"store at {self.where}: send failed: {e}") from e

    def _recv(self, n):
        out = bytearray()
        while len(out) < n:
            try:
                chunk = self._sock.recv(n - len(out))
            except socket.timeout:
                raise
            except OSError as e:
                raise StoreError(f"store at {self.where}: receive failed: {e}") from e
            if not chunk:
                raise StoreError(f"store at {self.where}: connection closed by gpurun")
            out += chunk
        return bytes(out)

    def _recv_bytes(self):
        (n,) = struct.unpack("<Q", self._recv(8))
        return self._recv(n)

    def set(self, key, value):
        """Writes ``value`` (str or bytes) under ``key``; wakes its waiters. No reply."""
        self._send(bytes([_SET]) + _bytes(key) + _bytes(value))

    def add(self, key, delta):
        """Adds ``delta`` (int) to the decimal counter at ``key``; returns the new value."""
        self._send(bytes([_ADD]) + _bytes(key) + struct.pack("<q", int(delta)))
        return struct.unpack("<q", self._recv(8))[0]

    def check(self, keys):
        """True when every key of ``keys`` (list of str) exists; never blocks."""
        self._send(bytes([_CHECK]) + struct.pack("<Q", len(keys)) + b"".join(_bytes(k) for k in keys))
        return self._recv(1) == b"\x00"

    def delete_key(self, key):
        """Removes ``key``; True if it existed."""
        self._send(bytes([_DELETE_KEY]) + _bytes(key))
        return struct.unpack("<q", self._recv(8))[0] == 1

    def wait(self, key, timeout_s):
        """Blocks until ``key`` exists or ``timeout_s`` (s) pass (then StoreTimeout, after a
        CANCEL_WAIT, as torch's client does)."""
        self._send(bytes([_WAIT]) + struct.pack("<Q", 1) + _bytes(key))
        self._sock.settimeout(timeout_s)
        try:
            reply = self._recv(1)
        except socket.timeout:
            self._sock.settimeout(None)
            self._send(bytes([_CANCEL_WAIT]))
            reply = self._recv(1)
            if reply == b"\x00":  # a STOP_WAITING crossed the cancel: the 1 follows
                self._recv(1)
                return
            raise StoreTimeout(f"store at {self.where}: wait for '{key}' timed out after "
                               f"{timeout_s:.0f} s") from None
        finally:
            self._sock.settimeout(None)
        if reply != b"\x00":
            raise StoreError(f"store at {self.where}: unexpected WAIT reply {reply!r}")

    def get(self, key, timeout_s=None):
        """Waits for ``key`` (forever when ``timeout_s`` is None, in 30 s slices) and returns
        its value (bytes)."""
        while True:
            try:
                self.wait(key, 30.0 if timeout_s is None else timeout_s)
                break
            except StoreTimeout:
                if timeout_s is not None:
                    raise
        self._send(bytes([_GET]) + _bytes(key))
        return self._recv_bytes()

    def close(self):
        self._sock.close()
