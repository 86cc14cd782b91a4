"""One rank of a multi-process TransformerEngine test script (tests/pytorch/distributed), run on
the CPU: CUDA mapped to the CPU (cuda_on_cpu.install), NCCL to gloo, and every configuration
the script runs (each call of one of its module-level `_test*` functions, which run_numerics.py
wraps in its run_distributed_test decorator) counted as passed or failed instead of stopping the
script at the first failure. ENTRY is the function that runs them all: main(SCRIPT_ARGS) for
run_numerics.py, run_parallel_tests() (no arguments) for test_fusible_ops.py; or "pytest" for
the scripts that are pytest files run on every rank (fsdp2_tests/), each test case then a
configuration (skipped cases are counted apart).

    python dist_rank.py SCRIPT ENTRY RESULTS_JSON -- SCRIPT_ARGS...

with torchrun's environment (RANK, WORLD_SIZE, LOCAL_RANK, LOCAL_WORLD_SIZE, MASTER_ADDR,
MASTER_PORT) set by distributed.py. Writes {"configs": [[name, passed, reason], ...]} to
RESULTS_JSON, this rank's view.
"""
import functools
import importlib.util
import json
import os
import pathlib
import sys
import traceback

import torch
import torch.distributed as dist

import cuda_on_cpu


def _gloo_for_nccl() -> None:
    """init_process_group / new_group asked for NCCL get gloo, without CUDA's device_id; device
    meshes asked for on CUDA are made on the CPU; checkpoints load without CUDA streams."""
    init, new_group = dist.init_process_group, dist.new_group

    def gloo(backend):  # "nccl", "cpu:gloo,cuda:nccl", ... -> gloo
        return "gloo" if backend is None or "nccl" in backend else backend

    def init_process_group(backend=None, *args, device_id=None, **kwargs):
        return init(gloo(backend), *args, **kwargs)

    def gloo_group(*args, backend=None, **kwargs):
        return new_group(*args, backend=gloo(backend), **kwargs)
    dist.init_process_group, dist.new_group = init_process_group, gloo_group
    dist.is_nccl_available = lambda: True
    # Device meshes (FSDP2, DTensor) named for CUDA are the CPU's.
    from torch.distributed import device_mesh
    init_mesh, mesh_init = device_mesh.init_device_mesh, device_mesh.DeviceMesh.__init__

    def init_device_mesh(device_type, *args, **kwargs):
        return init_mesh("cpu" if device_type == "cuda" else device_type, *args, **kwargs)

    def cpu_mesh(self, device_type, *args, **kwargs):
        mesh_init(self, "cpu" if device_type == "cuda" else device_type, *args, **kwargs)
    device_mesh.init_device_mesh = dist.device_mesh.init_device_mesh = init_device_mesh
    device_mesh.DeviceMesh.__init__ = cpu_mesh
    # torch.distributed.checkpoint stages through CUDA streams where torch.cuda answers that it
    # is available (as the mapping makes it): its serial loader instead.
    from torch.distributed.checkpoint import filesystem
    filesystem._OverlappingCpuLoader = lambda resolve_fun, **_: filesystem._SerialCpuLoader(resolve_fun)


def _counted(name: str, wrapper, configs: list):
    """wrapper (the script's decorated test) run as one configuration: an exception is this
    configuration's failure, recorded, and the script goes on with the next."""
    @functools.wraps(wrapper)
    def run(*args, **kwargs):
        label = f"{name}{args}{kwargs}" if kwargs or args else name
        try:
            wrapper(*args, **kwargs)
            configs.append([label, True, ""])
        except Exception as failure:  # the script's assertion, or an error of the package
            lines = traceback.format_exception_only(type(failure), failure)
            configs.append([label, False, lines[-1].strip()[:300]])
            if dist.is_initialized():
                dist.barrier()  # both ranks fail a configuration together (the script reduces its checks)
    return run


def _pytest(script: pathlib.Path, results: pathlib.Path) -> int:
    """The pytest file on this rank, with the cuda_on_cpu plugin; its cases as configurations."""
    import pytest
    from run import outcome, reason
    import xml.etree.ElementTree as ET
    junit = results.with_suffix(".xml")
    pytest.main([str(script), "-p", "cuda_on_cpu", "-q", "-p", "no:cacheprovider", f"--junitxml={junit}"])
    configs, skipped = [], 0
    if junit.exists():
        for case in ET.parse(junit).getroot().iter("testcase"):
            kind = outcome(case)
            if kind == "skipped":
                skipped += 1
            else:
                configs.append([case.get("name"), kind == "passed", "" if kind == "passed" else reason(case)])
    results.write_text(json.dumps({"configs": configs, "skipped": skipped}))
    return 0


def main() -> int:
    script, entry, results = pathlib.Path(sys.argv[1]), sys.argv[2], pathlib.Path(sys.argv[3])
    script_args = sys.argv[sys.argv.index("--") + 1:] if "--" in sys.argv else []
    _gloo_for_nccl()
    # Before any test code: a pytest file's conftest may call torch.cuda as it is imported,
    # before the plugin's pytest_configure (which maps CUDA again, the same way).
    cuda_on_cpu.install(device_count=int(os.environ["WORLD_SIZE"]))
    cuda_on_cpu.CudaAsCpu().__enter__()
    if entry == "pytest":
        return _pytest(script, results)
    sys.path.insert(0, str(script.parent))
    spec = importlib.util.spec_from_file_location(script.stem, script)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    cuda_on_cpu.imports_done()
    configs: list = []
    for name, value in list(vars(module).items()):
        if callable(value) and name.startswith("_test"):
            setattr(module, name, _counted(name, value, configs))
    try:
        if entry == "main":
            module.main(script_args)
        else:
            getattr(module, entry)()
    finally:
        results.write_text(json.dumps({"configs": configs}))
    return 0


if __name__ == "__main__":
    sys.exit(main())
