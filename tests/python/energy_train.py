"""tests/python/run_energy.sh's program: a small model on 2 CPU workers under gpurun
--simulate-gpus. Each epoch it opens the energy window "eval" on every rank; from the second
epoch on it prints, from rt.energy(), the joules of the epoch that just ended; after its loop,
rt.stop_reason with its detail. One JSON line per record in <out>/<slot>.jsonl.
Usage: energy_train.py OUT EPOCHS SECONDS_PER_EPOCH"""
import json
import os
import sys
import time

import torch

import gpurun

out, epochs, epoch_s = sys.argv[1], int(sys.argv[2]), float(sys.argv[3])
rt = gpurun.Runtime()
model = torch.nn.Linear(4, 1)
opt = torch.optim.SGD(model.parameters(), lr=0.01)
rt.track(model=model, optimizer=opt)
data = torch.utils.data.TensorDataset(torch.randn(64, 4), torch.randn(64, 1))
loader = rt.loader(data, batch_size=8)
log = open(os.path.join(out, f"{rt.slot}.jsonl"), "a")


def say(**record):
    log.write(json.dumps(dict(record, slot=rt.slot)) + "\n")
    log.flush()


for epoch in rt.epochs(epochs):
    if epoch > 0:
        e = rt.energy()
        last = e.epochs[-1]
        say(kind="epoch", epoch=last["epoch"], energy_j=last["energy_j"],
            gpu_energy_j=last["gpu_energy_j"], total_energy=e.total_energy, now_epoch=e.epoch)
    t0 = time.time()
    for x, y in loader:
        opt.zero_grad()
        torch.nn.functional.mse_loss(rt.model(x), y).backward()
        opt.step()
        time.sleep(epoch_s / 8 / 2)
    with rt.energy_window("eval") as m:
        time.sleep(epoch_s / 2)
    say(kind="window", epoch=epoch, rank=rt.rank, time=m.time, gpu_energy=m.gpu_energy,
        total_energy=m.total_energy)
r = rt.stop_reason
say(kind="stop", reason=str(r), text=r.text, predicted_cost_j=r.predicted_cost_j,
    threshold_j=r.threshold_j, is_str=isinstance(r, str))
