"""Runs TransformerEngine's multi-process PyTorch test scripts (tests/pytorch/distributed) against
this package on the CPU: each script on 2 ranks, gloo standing for NCCL and the CPU for CUDA
(dist_rank.py), and writes the configurations passed per script and quantization.

    .venv/bin/python tools/te_suite/distributed.py --te-repo PATH [--ref v2.18]
        [--scripts run_numerics.py test_fusible_ops.py]
        [--quantizations none fp8 fp8_cs mxfp8 fp8_block_scaling] [--out DIR]

The scripts are taken from tests/pytorch at --ref, unchanged. A configuration is one call of one
of the script's `_test*` functions; it passes when it passes on every rank. Results:
DIR/<ref>_distributed.md (and .json), beside the single-process figures.
"""
import argparse
import json
import pathlib
import socket
import subprocess
import sys
import tempfile
import time

from run import ROOT, export_tests

HERE = pathlib.Path(__file__).resolve().parent
QUANTIZATIONS = ("none", "fp8", "fp8_cs", "mxfp8", "fp8_block_scaling")
# script -> the function that runs its configurations (see dist_rank.py), and whether it takes
# run_numerics.py's --quantization (test_fusible_ops.py loops over the recipes itself).
SCRIPTS = {"run_numerics.py": ("main", True), "test_fusible_ops.py": ("run_parallel_tests", False),
           "fsdp2_tests/run_fsdp2_model.py": ("pytest", False),
           "fsdp2_tests/run_fsdp2_fused_adam.py": ("pytest", False)}


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def run_script(script: pathlib.Path, entry: str, script_args: list, ranks: int, timeout: float,
               scratch: pathlib.Path) -> dict:
    """{configs: [[name, passed on every rank, reason]], tail, seconds} of one script run."""
    port, start = _free_port(), time.time()
    pathlib.Path("/tmp/rdzv").unlink(missing_ok=True)  # test_fusible_ops.py's file rendezvous, left by a last run
    results = [scratch / f"rank{rank}.json" for rank in range(ranks)]
    processes = []
    for rank in range(ranks):
        env = {"RANK": str(rank), "WORLD_SIZE": str(ranks), "LOCAL_RANK": str(rank), "LOCAL_WORLD_SIZE": str(ranks),
               "MASTER_ADDR": "127.0.0.1", "MASTER_PORT": str(port), "PATH": "/usr/bin:/bin", "HOME": str(scratch),
               "PYTHONPATH": f"{HERE}:{script.parent}", "OMP_NUM_THREADS": "1"}
        command = [sys.executable, str(HERE / "dist_rank.py"), str(script), entry, str(results[rank]), "--",
                   *script_args]
        processes.append(subprocess.Popen(command, cwd=script.parent, env=env, stdout=subprocess.PIPE,
                                          stderr=subprocess.STDOUT, text=True))
    tails = []
    for process in processes:
        try:
            out, _ = process.communicate(timeout=max(1.0, timeout - (time.time() - start)))
        except subprocess.TimeoutExpired:
            process.kill()
            out, _ = process.communicate()
            out = f"timed out after {timeout:.0f} s\n{out}"
        tails.append(out[-3000:])
    found = [json.loads(path.read_text()) if path.exists() else {"configs": []} for path in results]
    views = [view["configs"] for view in found]
    configs = []
    for index, (name, passed, reason) in enumerate(views[0]):
        others = [view[index] for view in views[1:] if index < len(view)]
        every = passed and len(others) == ranks - 1 and all(other[1] for other in others)
        configs.append([name, every, reason or next((o[2] for o in others if o[2]), "")])
    return {"configs": configs, "skipped": found[0].get("skipped", 0), "tail": tails[0],
            "seconds": round(time.time() - start, 1)}


def report(ref: str, rows: list) -> str:
    lines = [f"# TransformerEngine {ref} tests/pytorch/distributed on this package (2 gloo ranks, CPU)", "",
             "| script | quantization | passed | configurations | fraction | skipped | s |",
             "| --- | --- | ---: | ---: | ---: | ---: | ---: |"]
    for row in rows:
        passed = sum(1 for _, ok, _ in row["configs"] if ok)
        ran = len(row["configs"])
        fraction = f"{passed / ran:.1%}" if ran else "—"
        lines.append(f"| {row['script']} | {row['quantization']} | {passed} | {ran} | {fraction} | "
                     f"{row.get('skipped', 0)} | {row['seconds']} |")
    for row in rows:
        failed = [(name, reason) for name, ok, reason in row["configs"] if not ok]
        if failed or not row["configs"]:
            lines += ["", f"## {row['script']} ({row['quantization']}): what fails", ""]
            lines += [f"- `{name[:150]}`: {reason}" for name, reason in failed]
            if not row["configs"]:
                lines += ["", "```", row["tail"].strip()[-1500:], "```"]
    return "\n".join(lines) + "\n"


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--te-repo", type=pathlib.Path, required=True)
    parser.add_argument("--ref", default="v2.18")
    parser.add_argument("--scripts", nargs="*", default=list(SCRIPTS))
    parser.add_argument("--quantizations", nargs="*", default=list(QUANTIZATIONS),
                        help="run_numerics.py's --quantization values (none: without)")
    parser.add_argument("--ranks", type=int, default=2)
    parser.add_argument("--timeout", type=float, default=3600.0, help="seconds per script run")
    parser.add_argument("--out", type=pathlib.Path, default=ROOT / "benchmarks" / "results" / "te_suite")
    args = parser.parse_args()
    rows = []
    with tempfile.TemporaryDirectory() as scratch:
        tests = export_tests(args.te_repo, args.ref, pathlib.Path(scratch))
        for name in args.scripts:
            script, (entry, by_quantization) = tests / "distributed" / name, SCRIPTS[name]
            for quantization in args.quantizations if by_quantization else ["all"]:
                script_args = [] if quantization in ("none", "all") else ["--quantization", quantization]
                run_dir = pathlib.Path(scratch) / f"run_{script.stem}_{quantization}"
                run_dir.mkdir()
                row = {"script": name, "quantization": quantization,
                       **run_script(script, entry, script_args, args.ranks, args.timeout, run_dir)}
                rows.append(row)
                passed = sum(1 for _, ok, _ in row["configs"] if ok)
                print(f"{name} {quantization}: {passed} of {len(row['configs'])} ({row['seconds']} s)", flush=True)
    args.out.mkdir(parents=True, exist_ok=True)
    (args.out / f"{args.ref}_distributed.md").write_text(report(args.ref, rows))
    (args.out / f"{args.ref}_distributed.json").write_text(json.dumps(rows, indent=1))
    print(f"written: {args.out / (args.ref + '_distributed.md')}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
