#!/usr/bin/env python3
"""Record torch's own TCPStore client talking to torch's own TCPStore server.

A relay sits between the two and writes every chunk, in the order the relay saw
it, to a fixture file that tests/store replays against gpurun's store and
compares byte for byte (see docs/conformance.md).

Usage:
    python3 record_relay.py OUT.txt
torch >= 2.10 records every command (list_keys came in 2.10; the GPU machine's 2.11 made
tests/store/fixtures/tcpstore_torch211.txt). torch 1.13 (Debian 12's python3-torch, made
tcpstore_torch113.txt) has no VALIDATE, append, multi_*, queues or list_keys: the operations its
client lacks are left out, and its server is the legacy (non-libuv) one.

Fixture format, one event per line:  <conn> <c2s|s2c> <hex bytes>
Lines starting with '#' are comments (torch version, the operation that follows).
"""
import datetime
import faulthandler
import multiprocessing
import socket
import subprocess
import sys
import threading
import time

import torch
import torch.distributed as dist

events = []  # (conn, dir, bytes) or ("#", text), kept by the relay process
lock = threading.Lock()
notes = None  # the main process's end of the pipe to the relay process


def note(text):
    print(text, file=sys.stderr, flush=True)
    notes.send(text)


def pump(conn_id, direction, src, dst):
    while True:
        try:
            data = src.recv(65536)
        except OSError:
            data = b""
        if not data:
            try:
                dst.shutdown(socket.SHUT_WR)
            except OSError:
                pass
            return
        with lock:  # record before forwarding: keeps causal order across connections
            events.append((conn_id, direction, data))
        dst.sendall(data)


def relay(listen_sock, upstream_port):
    conn_id = 0
    while True:
        try:
            client, _ = listen_sock.accept()
        except OSError:
            return
        server = socket.create_connection(("127.0.0.1", upstream_port))
        for s in (client, server):
            s.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        cid = conn_id
        conn_id += 1
        threading.Thread(target=pump, args=(cid, "c2s", client, server), daemon=True).start()
        threading.Thread(target=pump, args=(cid, "s2c", server, client), daemon=True).start()


def settle():
    time.sleep(0.15)  # let the relay record a reply before the next operation


LEGACY = not hasattr(dist.TCPStore, "append")  # torch < 2: no libuv server, fewer commands
STORE_KW = {} if LEGACY else {"use_libuv": True}


def relay_process(pipe, out_path):
    master = dist.TCPStore("127.0.0.1", 0, is_master=True, wait_for_workers=False, **STORE_KW)
    lsock = socket.socket()
    lsock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    lsock.bind(("127.0.0.1", 0))
    lsock.listen(16)
    threading.Thread(target=relay, args=(lsock, master.port), daemon=True).start()
    pipe.send(lsock.getsockname()[1])
    while True:
        msg = pipe.recv()
        if msg is None:
            pipe.send(write_fixture(out_path))
            return
        with lock:
            events.append(("#", msg))


def finish():
    notes.send(None)
    return notes.recv()


def waker(rport, expr):
    """A child process that runs `expr` on its own client 0.5 s from now (the caller blocks)."""
    code = (
        "import datetime, time, torch.distributed as d;"
        f"s = d.TCPStore('127.0.0.1', {rport}, is_master=False, timeout=datetime.timedelta(seconds=30));"
        f"time.sleep(0.5); {expr}"
    )
    return subprocess.Popen([sys.executable, "-c", code])


def write_fixture(out_path):
    with lock:
        snapshot = list(events)
    server = "legacy server" if LEGACY else "libuv server"
    with open(out_path, "w") as f:
        f.write(f"# recorded with torch {torch.__version__} ({server}) by scripts/conformance/record_relay.py\n")
        for e in snapshot:
            if e[0] == "#":
                f.write(f"# {e[1]}\n")
            else:
                f.write(f"{e[0]} {e[1]} {e[2].hex()}\n")
    return sum(1 for e in snapshot if e[0] != "#")


def main(out_path):
    faulthandler.dump_traceback_later(130, exit=False)
    # The relay (and torch's server) run in a process of their own: torch 1.13's client holds
    # the GIL while it blocks (its constructor included), which would freeze a relay thread.
    global notes
    notes, theirs = multiprocessing.Pipe()
    proc = multiprocessing.Process(target=relay_process, args=(theirs, out_path))
    proc.start()
    rport = notes.recv()

    td = datetime.timedelta
    note("connect: " + ("no handshake" if LEGACY else "VALIDATE + PING") + ", world_size=1 client sends ADD init/ 1")
    a = dist.TCPStore("127.0.0.1", rport, world_size=1, is_master=False, timeout=td(seconds=30), **STORE_KW)
    settle()
    note("connect second client (no world_size: no ADD)")
    b = dist.TCPStore("127.0.0.1", rport, is_master=False, timeout=td(seconds=30), **STORE_KW)
    settle()

    def fresh_client():
        return dist.TCPStore("127.0.0.1", rport, is_master=False, timeout=td(seconds=30), **STORE_KW)

    ops = [
        ("set", lambda s: s.set("key0", "value0")),
        ("get present", lambda s: s.get("key0")),
        ("add new key", lambda s: s.add("cnt", 5)),
        ("add negative", lambda s: s.add("cnt", -7)),
        ("get added counter (decimal text)", lambda s: s.get("cnt")),
        ("compare_set missing key, expected empty", lambda s: s.compare_set("cs1", "", "new")),
        ("compare_set missing key, expected non-empty", lambda s: s.compare_set("cs2", "x", "new")),
        ("compare_set present and equal", lambda s: s.compare_set("cs1", "new", "newer")),
        ("compare_set present and different", lambda s: s.compare_set("cs1", "zzz", "other")),
        ("check present", lambda s: s.check(["key0"])),
        ("check missing", lambda s: s.check(["key0", "nokey"])),
        ("wait present", lambda s: s.wait(["key0"])),
        ("num_keys", lambda s: s.num_keys()),
        ("delete_key present", lambda s: s.delete_key("cs1")),
        ("delete_key absent", lambda s: s.delete_key("cs1")),
        ("append new", lambda s: s.append("ap", "abc")),
        ("append existing", lambda s: s.append("ap", "def")),
        ("get appended", lambda s: s.get("ap")),
        ("multi_set", lambda s: s.multi_set(["m1", "m2"], ["v1", "v22"])),
        ("multi_get", lambda s: s.multi_get(["m1", "m2", "key0"])),
        ("set binary value", lambda s: s.set("bin", bytes(range(256)))),
        ("get binary", lambda s: s.get("bin")),
        ("queue_push", lambda s: s.queue_push("q", "one")),
        ("queue_push 2", lambda s: s.queue_push("q", "two")),
        ("queue_len (separate process)", "s.queue_len('q')"),
        ("queue_pop blocking (non-empty)", lambda s: s.queue_pop("q")),
        ("queue_pop non-blocking", lambda s: s.queue_pop("q", block=False)),
        ("queue_pop non-blocking on empty", lambda s: s.queue_pop("q", block=False)),
        ("queue_len empty (separate process)", "s.queue_len('q')"),
        ("num_keys after", lambda s: s.num_keys()),
    ]
    if LEGACY:  # the operations torch 1.13's Python client does not have
        ops = [(n, f) for n, f in ops
               if not n.startswith(("append", "get appended", "multi_", "queue_", "check"))]

    def in_child(expr):
        # Some torch 2.11 bindings (queue_len, list_keys) hold the GIL while they block,
        # so an unanswered call would freeze this recorder: run it in a child process.
        code = (
            "import datetime, torch.distributed as d;"
            f"s = d.TCPStore('127.0.0.1', {rport}, is_master=False, timeout=datetime.timedelta(seconds=30));"
            f"print(repr({expr}))"
        )
        try:
            r = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=8)
            note(f"  -> child printed {r.stdout.strip()!r} rc={r.returncode}")
        except subprocess.TimeoutExpired:
            note("  -> HUNG: torch's own server sent no reply within 8 s (child killed)")
        settle()

    for name, fn in ops:
        note(name)
        if isinstance(fn, str):
            in_child(fn)
            continue
        box = {}

        def call():
            try:
                box["r"] = fn(a)
            except Exception as e:  # noqa: BLE001  (QueueEmptyError etc. are part of the record)
                box["e"] = e

        t = threading.Thread(target=call, daemon=True)
        t.start()
        t.join(5.0)
        if t.is_alive():
            # torch's own server never answered: record that, abandon the connection.
            note("  -> HUNG: torch's server sent no reply within 5 s; continuing on a new connection")
            a = fresh_client()
        elif "e" in box:
            note(f"  -> raised {type(box['e']).__name__}: {box['e']}"[:200])
        else:
            note(f"  -> {box['r']!r}"[:200])
        settle()

    note("wait with timeout (client sends CANCEL_WAIT)")
    try:
        a.wait(["never"], td(milliseconds=300))
    except Exception as e:  # noqa: BLE001
        note(f"  -> raised {type(e).__name__}")
    settle()

    note("wait woken by another connection's set")
    w = waker(rport, "s.set('late', 'here')")
    a.wait(["late"], td(seconds=20))
    w.wait()
    settle()

    note("blocking get woken by another connection's add")
    res = {}
    w = waker(rport, "s.add('late2', 3)")
    res["v"] = a.get("late2")
    w.wait()
    note(f"  -> {res.get('v')!r}")
    settle()

    if LEGACY:
        del a, b
        time.sleep(0.3)
        print(f"wrote {finish()} chunks to {out_path}")
        return

    note("blocking queue_pop woken by a push from another connection")
    t = threading.Thread(target=lambda: res.setdefault("q", a.queue_pop("q2")))
    t.start()
    time.sleep(0.5)
    b.queue_push("q2", "pushed")
    t.join()
    settle()

    note("list_keys with one user key on a fresh pair of keys")
    for k in ["key0", "cnt", "cs2", "ap", "m1", "m2", "bin", "late", "late2"]:
        a.delete_key(k)
    settle()
    note("list_keys (separate process)")
    in_child("s.list_keys()")

    del a, b
    time.sleep(0.3)
    n = finish()
    print(f"wrote {n} chunks to {out_path}")
    faulthandler.cancel_dump_traceback_later()


if __name__ == "__main__":
    main(sys.argv[1])
