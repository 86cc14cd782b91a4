"""Runs TransformerEngine's own PyTorch tests against this package, on the CPU, and writes the
pass fraction per file with the most common failure reasons.

    .venv/bin/python tools/te_suite/run.py --te-repo PATH [--ref v2.18] [--files test_sanity.py ...]

PATH is a clone of NVIDIA/TransformerEngine (a bare or mirror git directory will do); the tests are
taken from tests/pytorch at --ref, unchanged, and run with the cuda_on_cpu plugin beside this file
(device="cuda" mapped to the CPU, CUDA-hardware cases skipped). The fraction counted is passed /
(passed + failed + errors): skipped cases, including the hardware-only ones, are not counted.
Results go to benchmarks/results/te_suite/<ref>.md (and .json).
"""
import argparse
import collections
import json
import pathlib
import re
import subprocess
import sys
import tempfile
import time
import xml.etree.ElementTree as ET

HERE = pathlib.Path(__file__).resolve().parent
ROOT = HERE.parents[1]
FILES = ("test_sanity.py", "test_numerics.py", "test_recipe.py", "test_fused_rope.py",
         "test_parallel_cross_entropy.py", "test_fused_optimizer.py", "test_gqa.py", "test_qk_norm.py",
         "test_deferred_init.py", "test_quantized_tensor.py", "test_multi_tensor.py", "test_fusible_ops.py")


def export_tests(te_repo: pathlib.Path, ref: str, into: pathlib.Path) -> pathlib.Path:
    """tests/pytorch of `ref`, written under `into` as files (nothing of the clone is changed)."""
    git_dir = te_repo / ".git" if (te_repo / ".git").exists() else te_repo
    archive = subprocess.run(["git", "--git-dir", str(git_dir), "archive", ref, "tests/pytorch"],
                             check=True, capture_output=True).stdout
    subprocess.run(["tar", "-x", "-C", str(into)], input=archive, check=True)
    return into / "tests" / "pytorch"


def outcome(case: ET.Element) -> str:
    for kind in ("failure", "error", "skipped"):
        if case.find(kind) is not None:
            return kind
    return "passed"


def reason(case: ET.Element) -> str:
    """The failure's message, first line, with numbers and reprs blurred so that alike ones group."""
    node = case.find("failure")
    node = node if node is not None else case.find("error")
    text = (node.get("message") or node.text or "").strip().splitlines()
    line = text[0] if text else "(no message)"
    line = re.sub(r"0x[0-9a-f]+", "0x…", line)
    line = re.sub(r"\d+(\.\d+)?(e[-+]?\d+)?", "N", line)
    return line[:160]


def run_file(tests: pathlib.Path, name: str, timeout: float, extra: list) -> dict:
    junit = tests / f".{name}.xml"
    command = [sys.executable, "-m", "pytest", "-p", "cuda_on_cpu", name, "-q", "-p", "no:cacheprovider",
               f"--junitxml={junit}", *extra]
    env = {"PYTHONPATH": f"{HERE}:{tests}", "PATH": "/usr/bin:/bin", "HOME": str(tests)}
    start = time.time()
    try:
        done = subprocess.run(command, cwd=tests, env=env, capture_output=True, text=True, timeout=timeout)
        tail = (done.stdout + done.stderr)[-3000:]
    except subprocess.TimeoutExpired as expired:
        tail = f"timed out after {timeout:.0f} s\n" + str(expired.stdout or "")[-2000:]
    counts = collections.Counter()
    reasons = collections.Counter()
    if junit.exists():
        for case in ET.parse(junit).getroot().iter("testcase"):
            kind = outcome(case)
            counts[kind] += 1
            if kind in ("failure", "error"):
                reasons[reason(case)] += 1
    ran = counts["passed"] + counts["failure"] + counts["error"]
    return {"file": name, "passed": counts["passed"], "failed": counts["failure"], "errors": counts["error"],
            "skipped": counts["skipped"], "ran": ran, "seconds": round(time.time() - start, 1),
            "reasons": reasons.most_common(12), "tail": tail if ran == 0 else ""}


def report(ref: str, results: list) -> str:
    lines = [f"# TransformerEngine {ref} tests/pytorch on this package (CPU, cuda mapped to cpu)", "",
             "| file | passed | ran | fraction | skipped | s |", "| --- | ---: | ---: | ---: | ---: | ---: |"]
    total_passed = total_ran = 0
    for r in results:
        fraction = f"{r['passed'] / r['ran']:.1%}" if r["ran"] else "—"
        lines.append(f"| {r['file']} | {r['passed']} | {r['ran']} | {fraction} | {r['skipped']} | {r['seconds']} |")
        total_passed += r["passed"]
        total_ran += r["ran"]
    if total_ran:
        lines.append(f"| **all** | {total_passed} | {total_ran} | {total_passed / total_ran:.1%} | | |")
    for r in results:
        if r["reasons"] or r["tail"]:
            lines += ["", f"## {r['file']}: what fails", ""]
            lines += [f"- {count} x `{text}`" for text, count in r["reasons"]]
            if r["tail"]:
                lines += ["", "```", r["tail"].strip()[-1500:], "```"]
    return "\n".join(lines) + "\n"


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--te-repo", type=pathlib.Path, required=True)
    parser.add_argument("--ref", default="v2.18")
    parser.add_argument("--files", nargs="*", default=list(FILES))
    parser.add_argument("--timeout", type=float, default=3600.0, help="seconds per file")
    parser.add_argument("--out", type=pathlib.Path, default=ROOT / "benchmarks" / "results" / "te_suite")
    parser.add_argument("pytest_args", nargs="*", help="passed to pytest after --, e.g. -- -k 'not large'")
    args = parser.parse_args()
    with tempfile.TemporaryDirectory() as scratch:
        tests = export_tests(args.te_repo, args.ref, pathlib.Path(scratch))
        results = []
        for name in args.files:
            results.append(run_file(tests, name, args.timeout, args.pytest_args))
            r = results[-1]
            print(f"{name}: {r['passed']} of {r['ran']} passed, {r['skipped']} skipped ({r['seconds']} s)", flush=True)
    args.out.mkdir(parents=True, exist_ok=True)
    (args.out / f"{args.ref}.md").write_text(report(args.ref, results))
    (args.out / f"{args.ref}.json").write_text(json.dumps(results, indent=1))
    print(f"written: {args.out / (args.ref + '.md')}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
