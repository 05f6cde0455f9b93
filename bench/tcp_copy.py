"""The raw TCP anchor of bench/elastic_nodes.sh: BYTES bytes from one process to another over one
TCP connection to HOST (default 127.0.0.1), nothing else on the wire. The sender sends from a
buffer it filled before the connect, the receiver receives into a buffer of BYTES that exists
before the clock starts (bytearray(n) writes its zeros: its pages are faulted in, as a warm
joiner's receive buffers are, StateRegistry::reserve_receive). The time runs from the receiver's
accept to its last byte. One JSON line per repetition on stdout:
{"bytes":…, "ms":…, "gb_s":…} (GB = 1e9 bytes).

python3 bench/tcp_copy.py BYTES [REPEAT=3] [HOST=127.0.0.1] [CHUNK_BYTES=4194304]
"""
import json
import multiprocessing as mp
import socket
import sys
import time


def send(port, host, n, chunk, ready):
    buf = memoryview(bytearray(b"\x5a") * n)  # touched before the clock starts
    ready.wait()
    s = socket.create_connection((host, port))
    s.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
    for off in range(0, n, chunk):
        s.sendall(buf[off:off + chunk])
    s.shutdown(socket.SHUT_WR)
    s.recv(1)  # the receiver's close: every byte arrived
    s.close()


def main():
    n = int(sys.argv[1])
    repeat = int(sys.argv[2]) if len(sys.argv) > 2 else 3
    host = sys.argv[3] if len(sys.argv) > 3 else "127.0.0.1"
    chunk = int(sys.argv[4]) if len(sys.argv) > 4 else 4 << 20
    for _ in range(repeat):
        ls = socket.socket()
        ls.bind((host, 0))
        ls.listen(1)
        ready = mp.Event()
        p = mp.Process(target=send, args=(ls.getsockname()[1], host, n, chunk, ready))
        p.start()
        buf = bytearray(n)  # zero-filled: its pages are in before the clock starts
        view = memoryview(buf)
        ready.set()
        c, _ = ls.accept()
        t0 = time.monotonic()
        got = 0
        while got < n:
            k = c.recv_into(view[got:], min(chunk, n - got))
            if k == 0:
                raise SystemExit(f"tcp_copy: the sender closed after {got} of {n} bytes")
            got += k
        ms = (time.monotonic() - t0) * 1e3
        c.close()
        ls.close()
        p.join()
        if buf[n - 1] != 0x5A:
            raise SystemExit("tcp_copy: the last byte received is not the one sent")
        print(json.dumps({"bytes": n, "ms": round(ms, 1), "gb_s": round(n / ms / 1e6, 3)}),
              flush=True)
        del buf, view


if __name__ == "__main__":
    main()
