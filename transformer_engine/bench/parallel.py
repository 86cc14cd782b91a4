"""te-bench parallel: one tensor-parallel te.TransformerLayer training step (forward + backward)
on `tp` processes, split into its communication and its computation.

Per rank and step (medians over the timed steps):
  step:     the step's wall time;
  exposed:  the time the step spends waiting for collectives (torch's profiler: the waits of the
            functional collectives, and the synchronous collectives, on the calling thread);
  compute:  step - exposed;
  comm:     the step's collectives alone: each one the profiler saw (op, shape), issued again on
            its own and waited for, summed;
  overlap:  the share of comm that ran beside computation, 1 - exposed / comm.
On the CPU the collectives are gloo's, which run on their own thread but share the cores with
the GEMMs: the figures show the mechanism, not a speed-up. On GPUs the ranks use NCCL, one
device each.
"""
import dataclasses
import datetime
import socket
import statistics
import time
from typing import Dict, List, Tuple

import torch
import torch.distributed as dist
import torch.distributed._functional_collectives as funcol
import torch.multiprocessing as mp

# The profiler names of the functional collectives the modules issue, and how to issue each
# again alone on a tensor of the recorded input shape.
_COLLECTIVES = {
    "_c10d_functional::all_gather_into_tensor": lambda t, g: funcol.all_gather_single(t, 0, g),
    "_c10d_functional::reduce_scatter_tensor": lambda t, g: funcol.reduce_scatter_single(t, "sum", 0, g),
    "_c10d_functional::all_reduce": lambda t, g: funcol.all_reduce(t, "sum", g),
}
_WAITS = ("_c10d_functional::wait_tensor", "c10d::allreduce_", "c10d::allgather_", "c10d::barrier")


@dataclasses.dataclass(frozen=True)
class ParallelConfig:
    tp: int = 2
    hidden: int = 1024
    ffn: int = 4096
    heads: int = 16
    seq: int = 512
    batch: int = 2
    sequence_parallel: bool = True
    dtype: str = "bfloat16"
    warmup: int = 2
    steps: int = 5
    device: str = "cpu"


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _layer_and_input(cfg: ParallelConfig, device: torch.device):
    import transformer_engine.pytorch as te
    dtype = getattr(torch, cfg.dtype)
    layer = te.TransformerLayer(cfg.hidden, cfg.ffn, cfg.heads, tp_group=dist.group.WORLD, tp_size=cfg.tp,
                                set_parallel_mode=True, sequence_parallel=cfg.sequence_parallel,
                                hidden_dropout=0.0, attention_dropout=0.0, params_dtype=dtype, device=device)
    seq = cfg.seq // cfg.tp if cfg.sequence_parallel else cfg.seq  # [s / tp, b, h]: this rank's share
    x = torch.randn(seq, cfg.batch, cfg.hidden, dtype=dtype, device=device, requires_grad=True)
    return layer, x


def _step(layer, x) -> None:
    layer(x).float().sum().backward()


def _profiled_step(layer, x) -> Tuple[float, List[Tuple[str, tuple]]]:
    """(ms spent waiting for collectives, [(collective, input shape)]) of one step."""
    from torch.profiler import ProfilerActivity, profile
    with profile(activities=[ProfilerActivity.CPU], record_shapes=True) as prof:
        _step(layer, x)
    waited, issued = 0.0, []
    for event in prof.events():
        if event.name in _WAITS:
            waited += event.cpu_time_total / 1e3
        elif event.name in _COLLECTIVES:
            issued.append((event.name, tuple(event.input_shapes[0])))
    return waited, issued


def _comm_alone(issued: List[Tuple[str, tuple]], dtype: torch.dtype, device: torch.device) -> float:
    """ms of the step's collectives issued again one by one, each waited for."""
    tensors = [(name, torch.randn(shape, device=device).to(dtype)) for name, shape in issued]
    dist.barrier()
    start = time.perf_counter()
    for name, tensor in tensors:
        funcol.wait_tensor(_COLLECTIVES[name](tensor, dist.group.WORLD))
    return (time.perf_counter() - start) * 1e3


def _rank(rank: int, cfg: ParallelConfig, port: int, results) -> None:
    from .harness import configure_allocator
    configure_allocator()  # freed tensors kept mapped, as in every te-bench process
    backend = "gloo" if cfg.device == "cpu" else "nccl"
    # A rank that fails leaves the others waiting in a collective: they give up after 10 minutes.
    dist.init_process_group(backend, init_method=f"tcp://127.0.0.1:{port}", rank=rank, world_size=cfg.tp,
                            timeout=datetime.timedelta(minutes=10))
    try:
        device = torch.device(cfg.device if cfg.device == "cpu" else f"{cfg.device}:{rank}")
        torch.manual_seed(0)
        layer, x = _layer_and_input(cfg, device)
        for _ in range(cfg.warmup):
            _step(layer, x)
        steps, exposed, comm = [], [], []
        for _ in range(cfg.steps):
            dist.barrier()
            start = time.perf_counter()
            _step(layer, x)
            steps.append((time.perf_counter() - start) * 1e3)
            waited, issued = _profiled_step(layer, x)
            exposed.append(waited)
            comm.append(_comm_alone(issued, getattr(torch, cfg.dtype), device))
        element_size = torch.tensor([], dtype=getattr(torch, cfg.dtype)).element_size()
        sent = sum(torch.Size(shape).numel() for _, shape in issued) * element_size  # the collectives' inputs
        results[rank] = {"step_ms": statistics.median(steps), "exposed_ms": statistics.median(exposed),
                         "comm_ms": statistics.median(comm), "collectives": len(issued), "bytes": sent}
    finally:
        dist.destroy_process_group()


def run(cfg: ParallelConfig) -> Dict[str, object]:
    """The figures of every rank, and the step's compute and overlap (see the module docstring)."""
    if cfg.seq % cfg.tp or cfg.heads % cfg.tp or cfg.ffn % cfg.tp:
        raise ValueError(f"te-bench parallel: seq={cfg.seq}, heads={cfg.heads} and ffn={cfg.ffn} must divide by "
                         f"tp={cfg.tp}")
    results = mp.Manager().dict()
    mp.spawn(_rank, args=(cfg, _free_port(), results), nprocs=cfg.tp, join=True)
    ranks = []
    for rank in sorted(results.keys()):
        row = dict(results[rank], rank=rank)
        row["compute_ms"] = row["step_ms"] - row["exposed_ms"]
        row["overlap"] = max(0.0, min(1.0, 1.0 - row["exposed_ms"] / row["comm_ms"])) if row["comm_ms"] else 0.0
        ranks.append(row)
    return {"config": dataclasses.asdict(cfg), "ranks": ranks}


def table(result: Dict[str, object]) -> str:
    cfg = result["config"]
    lines = [f"TransformerLayer({cfg['hidden']}, {cfg['ffn']}, {cfg['heads']}) step, "
             f"[s={cfg['seq']}, b={cfg['batch']}] "
             f"{cfg['dtype']}, tp={cfg['tp']}, sequence_parallel={cfg['sequence_parallel']}, {cfg['device']}",
             "| rank | step ms | compute ms | exposed comm ms | comm alone ms | overlap | collectives | MB sent |",
             "| ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: |"]
    for row in result["ranks"]:
        lines.append(f"| {row['rank']} | {row['step_ms']:.1f} | {row['compute_ms']:.1f} | {row['exposed_ms']:.1f} | "
                     f"{row['comm_ms']:.1f} | {row['overlap']:.0%} | {row['collectives']} | "
                     f"{row['bytes'] / 2**20:.1f} |")
    return "\n".join(lines)
