"""The training state's checksum (``Runtime.checksum``): per tensor, sums of its bytes as int32
words taken on its own device as the C++ runtime takes them
(worker_runtime/src/state/state_checksum.cpp), then BLAKE2b over them and the state's
structure. Exact integers: CPU and CUDA agree. Not cryptographic.
"""
import hashlib

import numpy as np
import torch


class StateMismatch(RuntimeError):
    """The training state is not the one expected: the ranks' checksums differ after a start
    or resize (names the ranks), or the pause snapshot a resume reads cannot be read or holds
    another position than its pause. Not a program error: gpurun treats the rank as failed
    (as the C++ runtime's StateError), and says the state is lost when no rank has it."""


def _word_sums(t):
    """int64 [2] on t's device: S = sum(w_i), P = sum((i+1) * w_i) over t's bytes as int32
    words w_i (zero-padded to a whole word), wrapping modulo 2^64."""
    if t.numel() == 0:
        return torch.zeros(2, dtype=torch.int64, device=t.device)
    b = t.contiguous().reshape(-1).view(torch.uint8)
    pad = -b.numel() % 4
    if pad:
        b = torch.cat([b, torch.zeros(pad, dtype=torch.uint8, device=b.device)])
    w = b.view(torch.int32).to(torch.int64)
    weighted = (w * torch.arange(1, w.numel() + 1, dtype=torch.int64, device=w.device)).sum()
    return torch.stack([w.sum(), weighted])


# Words (4 bytes) per chunk of _word_sums_many: the C++ runtime's
# StateChecksum::kDefaultChunkWords (worker_runtime/src/state/state_checksum.hpp), 128 MiB of state.
_CHUNK_WORDS = 32 << 20
# On the CPU, chunks whose int64 prefix sums (8 MiB each) malloc reuses: glibc gives blocks over
# 32 MiB back to the kernel when freed, and page-faulting them afresh per chunk made 50M words
# (400 tensors) ~9x slower than one _word_sums per tensor; at 1 Mi words it is about as fast.
_CPU_CHUNK_WORDS = 1 << 20
_MASK64 = (1 << 64) - 1
# Words per block of _cpu_word_sums (4 MiB of state; an 8 MiB uint64 buffer).
_CPU_LOOP_WORDS = 1 << 20


def _cpu_word_sums(t):
    """[S, P] (Python ints modulo 2^64) of a CPU tensor: _word_sums(t)'s definition, in one pass
    over t's bytes (a numpy view; a contiguous copy only where t is not contiguous), per block
    of _CPU_LOOP_WORDS words: the words cast into one reused uint64 buffer (sign-extended:
    C's conversion modulo 2^64), S_b = its sum and P_b = its dot with 1..L, both wrapping in
    uint64; a block at word k adds S_b and P_b + k*S_b. The C++ runtime's cpu_word_sums()
    (worker_runtime/src/state/state_checksum.hpp). 0.68 s for 1.07 GB on the 2-core CI machine
    against 5.6 s for the chunked prefix sums there."""
    if t.numel() == 0:
        return [0, 0]
    b = t.detach().contiguous().reshape(-1).view(torch.uint8).numpy()
    n, rest = divmod(b.size, 4)
    w = b[:4 * n].view(np.int32)  # numpy reads a view that starts inside a word
    if rest:
        w = np.concatenate([w, np.frombuffer(bytes(b[4 * n:]) + bytes(4 - rest), np.int32)])
    ones = np.arange(1, min(len(w), _CPU_LOOP_WORDS) + 1, dtype=np.uint64)
    buf = np.empty(len(ones), dtype=np.uint64)
    s_all = p_all = 0
    for k in range(0, len(w), _CPU_LOOP_WORDS):
        block = w[k:k + _CPU_LOOP_WORDS]
        u = buf[:len(block)]
        np.copyto(u, block, casting="unsafe")
        s = int(u.sum(dtype=np.uint64))
        s_all += s
        p_all += int(u @ ones[:len(block)]) + k * s
    return [s_all & _MASK64, p_all & _MASK64]


def _words(t):
    """t's bytes as an int32 [n] tensor on t's device, zero-padded to a whole word: a view of t
    where t is contiguous, word-aligned and a whole number of words long, else a copy."""
    b = t.contiguous().reshape(-1).view(torch.uint8)
    pad = -b.numel() % 4
    if pad:
        b = torch.cat([b, torch.zeros(pad, dtype=torch.uint8, device=b.device)])
    elif b.storage_offset() % 4:  # .view(torch.int32) needs a word-aligned start
        b = b.clone()
    return b.view(torch.int32)


def _word_sums_many(tensors, chunk_words=None, cpu_loop=True):
    """[S, P] (Python ints, signed int64 values) per tensor of `tensors`, in order: the sums of
    _word_sums(t), computed as the C++ runtime's StateChecksum::tensor_sums() does. Per device,
    the tensors' words are packed in order into chunks of at most `chunk_words` words (a tensor
    may span chunks); per chunk, C1 = cumsum(w) and C2 = cumsum(C1) in int64 (wrapping) and the
    four entries each piece [b, e) needs; then per piece of length L starting at word k of its
    tensor, on the host modulo 2^64: s = C1[e-1] - C1[b-1] (C[-1] = 0), S += s and
    P += L*s - (C2[e-2] - C2[b-1]) + (L-1)*C1[b-1] + k*s. About ten operations per chunk, not
    per tensor. Blocks: one device->host copy per device (all devices' work is queued first).
    Device memory: per chunk the copy of its words (torch.cat, unless one piece fills it) and
    the two int64 prefix sums, 16 bytes per word. `chunk_words`: words per chunk, > 0; None:
    _CHUNK_WORDS, on the CPU _CPU_CHUNK_WORDS. `cpu_loop`: CPU tensors take _cpu_word_sums
    instead (the same values; False: the chunks on the CPU too, for tests)."""
    if chunk_words is not None and chunk_words <= 0:
        raise ValueError(f"_word_sums_many: chunk_words must be > 0, got {chunk_words}")
    sums = [[0, 0] for _ in tensors]
    by_device = {}  # device -> [(tensor index, words)]
    for i, t in enumerate(tensors):
        if cpu_loop and t.device.type == "cpu":
            sums[i] = _cpu_word_sums(t)
        elif t.numel() > 0:
            by_device.setdefault(t.device, []).append((i, _words(t)))
    pending = []  # per device: (chunks of pieces (tensor index, offset, len, begin), tensor)
    for device, items in by_device.items():
        cw = chunk_words or (_CPU_CHUNK_WORDS if device.type == "cpu" else _CHUNK_WORDS)
        chunks, fill = [[]], 0
        for i, w in items:
            off, total = 0, w.numel()
            while off < total:
                if fill == cw:
                    chunks.append([])
                    fill = 0
                n = min(cw - fill, total - off)
                chunks[-1].append((i, off, n, fill))
                fill += n
                off += n
        words = dict(items)
        # The gather indices of every chunk in one host->device copy: per chunk, C1[b-1] and
        # C1[e-1] of each piece, then C2[b-1] and C2[e-2] (an index of -1 reads entry 0, which
        # the host ignores).
        index = []
        for chunk in chunks:
            index += [x for _, _, n, b in chunk for x in (max(b - 1, 0), b + n - 1)]
            index += [x for _, _, n, b in chunk for x in (max(b - 1, 0), max(b + n - 2, 0))]
        index = torch.tensor(index, dtype=torch.int64).to(device)
        gathered, at = [], 0
        for chunk in chunks:
            k = len(chunk)
            parts = [words[i][off:off + n] for i, off, n, _ in chunk]
            flat = parts[0] if k == 1 else torch.cat(parts)
            c1 = torch.cumsum(flat, 0, dtype=torch.int64)
            c2 = torch.cumsum(c1, 0)
            gathered += [c1.index_select(0, index[at:at + 2 * k]),
                         c2.index_select(0, index[at + 2 * k:at + 4 * k])]
            at += 4 * k
            del flat, c1, c2  # freed before the next chunk's are made
        pending.append((chunks, torch.cat(gathered)))
    for chunks, gathered in pending:
        g, at = gathered.cpu().tolist(), 0  # one device->host copy per device
        for chunk in chunks:
            k = len(chunk)
            for j, (i, off, n, b) in enumerate(chunk):
                c1b = 0 if b == 0 else g[at + 2 * j]
                c1e = g[at + 2 * j + 1]
                c2b = 0 if b == 0 else g[at + 2 * k + 2 * j]
                c2e = 0 if b + n < 2 else g[at + 2 * k + 2 * j + 1]
                s = c1e - c1b
                sums[i][0] += s
                sums[i][1] += n * s - (c2e - c2b) + (n - 1) * c1b + off * s  # sum (i+1)*w_i
            at += 4 * k
    for v in sums:
        for j in (0, 1):
            x = v[j] & _MASK64
            v[j] = x - (1 << 64) if x >> 63 else x
    return sums


def _state_digest(state, sums_of):
    """Runtime.checksum's hash of `state` (nested dicts, lists and tuples of tensors and other
    values): BLAKE2b (8 bytes, a signed int) over, in feed order, each dict key (sorted by
    str), each tensor's "dtype:shape;" and each other value's repr, then every tensor's S and
    P (8 bytes each, little-endian, signed) in the same order. `sums_of(tensors)`: the [S, P]
    pairs of a list of tensors (_word_sums_many; the definition is _word_sums)."""
    h = hashlib.blake2b(digest_size=8)
    tensors = []

    def feed(obj):
        if isinstance(obj, torch.Tensor):
            t = obj.detach()
            h.update(f"{t.dtype}:{tuple(t.shape)};".encode())
            tensors.append(t)
        elif isinstance(obj, dict):
            for k in sorted(obj, key=str):
                h.update(str(k).encode())
                feed(obj[k])
        elif isinstance(obj, (list, tuple)):
            for x in obj:
                feed(x)
        else:
            h.update(repr(obj).encode())

    feed(state)
    for v in sums_of(tensors):
        h.update(b"".join(int(x).to_bytes(8, "little", signed=True) for x in v))
    return int.from_bytes(h.digest(), "little", signed=True)
