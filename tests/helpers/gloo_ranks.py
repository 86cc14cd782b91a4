"""Runs a function on several gloo ranks over this machine's loopback, one process each, on a
free port; a collective waiting for a rank that failed or hangs gives up after TIMEOUT, and
torch.multiprocessing stops the other ranks as soon as one fails, so a test ends."""
import datetime
import socket
from typing import Callable, Dict

import torch.distributed as dist
import torch.multiprocessing as mp


TIMEOUT = datetime.timedelta(seconds=120)


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _rank_main(rank: int, fn: Callable, world: int, port: int, results) -> None:
    dist.init_process_group("gloo", init_method=f"tcp://127.0.0.1:{port}", rank=rank, world_size=world,
                            timeout=TIMEOUT)
    try:
        results[rank] = fn(rank, world)
    finally:
        dist.destroy_process_group()


def run_on_ranks(fn: Callable, world: int = 2) -> Dict[int, object]:
    """{rank: fn(rank, world)} with the default process group set up in each rank; fn must be
    a module-level function (the ranks are spawned processes)."""
    results = mp.Manager().dict()
    mp.spawn(_rank_main, args=(fn, world, _free_port(), results), nprocs=world, join=True)
    return dict(results)
