"""A script written for `python -m torch.distributed.launch` (the Zeus origin's example and
most pre-2.0 tutorials): the local rank comes as an argument unless --use-env. It joins the
group, sums its rank across the world, and writes what it was given to OUT/rank<RANK>.json.
Usage: launch_line.py --out DIR [--local_rank N | --local-rank N]"""
import argparse
import json
import os
import sys

import torch
import torch.distributed as dist

parser = argparse.ArgumentParser()
parser.add_argument("--out", required=True)
# torch >= 2.0 passes --local-rank, older --local_rank; a script for both takes both.
parser.add_argument("--local-rank", "--local_rank", dest="local_rank", type=int, default=None)
args = parser.parse_args()

dist.init_process_group("gloo", init_method="env://")
total = torch.tensor([float(dist.get_rank())])
dist.all_reduce(total)
with open(os.path.join(args.out, f"rank{dist.get_rank()}.json"), "w") as f:
    json.dump({"argv": sys.argv[1:], "local_rank_arg": args.local_rank,
               "LOCAL_RANK": os.environ.get("LOCAL_RANK"), "world": dist.get_world_size(),
               "sum": total.item()}, f)
dist.destroy_process_group()
