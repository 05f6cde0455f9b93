"""gpurun's elastic sampler in Python: the same permutation as the C++ one
(worker_runtime/src/data/elastic_sampler.cpp: Fisher–Yates over std::mt19937_64 seeded with
splitmix64(seed) ^ splitmix64(epoch + 1), rejection-sampled bounds), so a Python rank and a
C++ rank deal the same samples."""

_M64 = (1 << 64) - 1


def _mix(x):
    x = (x + 0x9E3779B97F4A7C15) & _M64
    x = ((x ^ (x >> 30)) * 0xBF58476D1CE4E5B9) & _M64
    x = ((x ^ (x >> 27)) * 0x94D049BB133111EB) & _M64
    return x ^ (x >> 31)


class _MT19937_64:
    """std::mt19937_64 (the C++ standard's parameters)."""

    def __init__(self, seed):
        mt = [0] * 312
        mt[0] = seed & _M64
        for i in range(1, 312):
            mt[i] = (6364136223846793005 * (mt[i - 1] ^ (mt[i - 1] >> 62)) + i) & _M64
        self.mt, self.i = mt, 312

    def _twist(self):
        mt = self.mt
        for i in range(312):
            x = (mt[i] & 0xFFFFFFFF80000000) | (mt[(i + 1) % 312] & 0x7FFFFFFF)
            xa = x >> 1
            if x & 1:
                xa ^= 0xB5026F5AA96619E9
            mt[i] = mt[(i + 156) % 312] ^ xa
        self.i = 0

    def __call__(self):
        if self.i >= 312:
            self._twist()
        y = self.mt[self.i]
        self.i += 1
        y ^= (y >> 29) & 0x5555555555555555
        y ^= (y << 17) & 0x71D67FFFEDA60000
        y ^= (y << 37) & 0xFFF7EEE000000000
        y ^= y >> 43
        return y & _M64


def permutation(size, seed, epoch, shuffle=True):
    """The epoch's permutation of range(size) (list of int), identical to the C++ sampler's."""
    perm = list(range(size))
    if not shuffle or size < 2:
        return perm
    rng = _MT19937_64(_mix(seed & _M64) ^ _mix((epoch + 1) & _M64))
    for i in range(size - 1, 0, -1):
        bound = i + 1
        limit = _M64 - (_M64 % bound)
        x = rng()
        while x >= limit:
            x = rng()
        j = x % bound
        perm[i], perm[j] = perm[j], perm[i]
    return perm


class ElasticSampler:
    """One global permutation per (seed, epoch); a cursor of samples already trained this
    epoch. Each step takes a window of the next ``count`` samples, dealt strided by rank, so
    every sample is seen exactly once per epoch however the world size changes between
    steps. State: (epoch, cursor)."""

    def __init__(self, size, seed=0, shuffle=True, drop_last=False):
        if size < 0:
            raise ValueError(f"ElasticSampler: dataset size {size} is negative")
        self.size, self.seed, self.shuffle, self.drop_last = size, seed, shuffle, drop_last
        self.set_epoch(0)

    def set_epoch(self, epoch):
        if epoch < 0:
            raise ValueError(f"ElasticSampler: epoch {epoch} is negative")
        self.epoch, self.cursor = epoch, 0
        self._perm = permutation(self.size, self.seed, epoch, self.shuffle)

    def remaining(self):
        return self.size - self.cursor

    def window(self, count, rank, world, offset=0):
        """This rank's indices of the ``count`` samples that start ``offset`` samples after
        the cursor (list of int; offset 0: the next window)."""
        if count < 0 or offset < 0 or offset + count > self.remaining():
            raise ValueError(f"ElasticSampler: a window of {count} samples does not fit at "
                             f"cursor {self.cursor} + {offset} of {self.size} (epoch {self.epoch})")
        base = self.cursor + offset
        return [self._perm[base + p] for p in range(rank, count, world)]

    def advance(self, count):
        if count < 0 or count > self.remaining():
            raise ValueError(f"ElasticSampler: cannot advance by {count} at cursor "
                             f"{self.cursor} of {self.size}")
        self.cursor += count

    def state_dict(self):
        return {"epoch": self.epoch, "cursor": self.cursor}

    def load_state_dict(self, s):
        self.set_epoch(int(s["epoch"]))
        if not 0 <= int(s["cursor"]) <= self.size:
            raise ValueError(f"ElasticSampler: cursor {s['cursor']} does not fit {self.size}")
        self.cursor = int(s["cursor"])
