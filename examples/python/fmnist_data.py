"""Fashion-MNIST from its IDX files (Debian's dataset-fashion-mnist installs them in
/usr/share/datasets/fashion-mnist), for the examples in this folder: ``load(data_dir, split,
limit)`` is a ``TensorDataset`` of normalised 1×28×28 float images and int64 labels."""
import gzip
import os

import numpy as np
import torch

DEFAULT_DIR = "/usr/share/datasets/fashion-mnist"


def read_idx(path):
    """An IDX file (gzip or plain) as a numpy array: images (n, 28, 28) uint8 or labels (n,)."""
    opener = gzip.open if path.endswith(".gz") else open
    with opener(path, "rb") as f:
        raw = f.read()
    dims = raw[3]
    shape = tuple(int.from_bytes(raw[4 + 4 * i:8 + 4 * i], "big") for i in range(dims))
    return np.frombuffer(raw, dtype=np.uint8, offset=4 + 4 * dims).reshape(shape)


def load(data_dir, split, limit=0):
    """``split`` "train" (60,000 images) or anything else (the 10,000 test images); ``limit``:
    the first ``limit`` only (0: all)."""
    name = "train" if split == "train" else "t10k"
    find = lambda kind: next(os.path.join(data_dir, f) for f in (  # noqa: E731
        f"{name}-{kind}-idx{3 if kind == 'images' else 1}-ubyte.gz",
        f"{name}-{kind}-idx{3 if kind == 'images' else 1}-ubyte")
        if os.path.exists(os.path.join(data_dir, f)))
    x = torch.from_numpy(read_idx(find("images")).copy()).float().div_(255).sub_(0.2860).div_(0.3530)
    y = torch.from_numpy(read_idx(find("labels")).copy()).long()
    if limit:
        x, y = x[:limit], y[:limit]
    return torch.utils.data.TensorDataset(x.unsqueeze(1), y)
