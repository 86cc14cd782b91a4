"""Builds the portable TransformerEngine extension: the torch-free kernels (kernels/) and the
ATen bindings (bindings/) into one module, transformer_engine._kernels.

Install with torch already present:  pip install -e . --no-build-isolation
The device backends are chosen from what is installed, and the choice is printed:
  cpu   always
  cuda  a CUDA build of torch and nvcc, when kernels/cuda/ has sources
  musa  torch_musa, when kernels/musa/ has sources
"""
import glob
import importlib.util
import os
import shutil

import torch
from setuptools import find_packages, setup
from torch.utils.cpp_extension import BuildExtension, CppExtension

ROOT = os.path.dirname(os.path.abspath(__file__))


def read_version() -> str:
    """__version__ from transformer_engine/_version.py, read without importing the package."""
    scope = {}
    with open(os.path.join(ROOT, "transformer_engine", "_version.py")) as source:
        exec(source.read(), scope)
    return scope["__version__"]


VERSION = read_version()


def device_backends():
    """Returns ([compiled backends], [one line per backend saying why it is in or out])."""
    compiled, report = ["cpu"], ["cpu: built (SIMD tier chosen at run time: avx512, avx2 or portable)"]
    cuda_sources = glob.glob(os.path.join(ROOT, "kernels", "cuda", "*.cu"))
    if torch.version.cuda is None:
        report.append("cuda: skipped (this torch is a CPU build)")
    elif shutil.which("nvcc") is None:
        report.append(f"cuda: skipped (torch has CUDA {torch.version.cuda} but nvcc is not on PATH)")
    elif not cuda_sources:
        report.append("cuda: no compiled CUDA kernels (none needed): CUDA tensors run the Triton kernels "
                      "where triton is installed, else the reference ops")
    else:
        raise RuntimeError("kernels/cuda/ has sources but setup.py does not build them yet")
    if importlib.util.find_spec("torch_musa") is None:
        report.append("musa: skipped (torch_musa is not installed)")
    else:
        report.append("musa: no compiled MUSA kernels (none needed): MUSA tensors run the Triton kernels "
                      "where torch_musa's triton is installed, else the reference ops")
    return compiled, report


# The SIMD tiers every kernel header in kernels/cpu/families.txt is compiled for (te_kernels::CpuIsa).
TIERS = ("portable", "avx2", "avx512")


def write_tier_units(out_dir: str) -> list:
    """Writes, for every kernel header in kernels/cpu/families.txt and every tier, the unit that
    compiles it for that tier (the file says what a unit holds; CMakeLists.txt writes the same
    ones), and returns their paths."""
    with open(os.path.join(ROOT, "kernels", "cpu", "families.txt")) as listing:
        headers = [line.strip() for line in listing if line.strip() and not line.startswith("#")]
    units = []
    for header in headers:
        name = os.path.basename(header).removesuffix("_kernels.h")
        for tier in TIERS:
            text = (f"// Generated from kernels/cpu/families.txt: cpu/{header} built for the {tier} tier.\n"
                    f'#include "te_kernels/{name}.h"\n#include "cpu/isa/tier_{tier}.h"\n#include "cpu/{header}"\n')
            units.append(os.path.join(out_dir, f"{name}_{tier}.cpp"))
            write_if_changed(units[-1], text)
    return units


def write_if_changed(path: str, text: str) -> None:
    """Leaves a file that already holds `text` untouched, so that ninja does not recompile it."""
    if os.path.exists(path):
        with open(path) as current:
            if current.read() == text:
                return
    os.makedirs(os.path.dirname(path), exist_ok=True)
    with open(path, "w") as new:
        new.write(text)


class BuildWithTierUnits(BuildExtension.with_options(use_ninja=True)):
    """BuildExtension that first writes the per-tier units into its build directory."""

    def build_extensions(self):
        units = write_tier_units(os.path.join(self.build_temp, "tier_units"))
        for ext in self.extensions:
            ext.sources += units
        super().build_extensions()


def extension(backends):
    sources = sorted(glob.glob("kernels/cpu/*.cpp") + glob.glob("kernels/cpu/*/*.cpp")
                     + glob.glob("bindings/*.cpp"))
    return CppExtension(
        name="transformer_engine._kernels",
        sources=sources,
        include_dirs=[os.path.join(ROOT, "kernels", "include"), os.path.join(ROOT, "kernels"),
                      os.path.join(ROOT, "bindings")],
        define_macros=[("TE_VERSION", f'"{VERSION}"'), ("TE_BACKENDS", f'"{",".join(backends)}"')],
        # No -march=native: SIMD tiers are compiled per file and chosen at run time.
        # -fopenmp: at::parallel_for is a header template that only forks threads when the
        # caller is compiled with OpenMP (torch's CPU wheels use the OpenMP backend; the
        # runtime torch ships, libgomp.so.1, is the one that gets used).
        extra_compile_args=["-O3", "-Wall", "-Wno-unused-parameter", "-fopenmp"],
        extra_link_args=["-fopenmp"],
    )


backends, report = device_backends()
print("portable TransformerEngine build:\n  " + "\n  ".join(report))

setup(
    version=VERSION,
    packages=find_packages(include=["transformer_engine", "transformer_engine.*", "transformer_engine_torch"]),
    ext_modules=[extension(backends)],
    cmdclass={"build_ext": BuildWithTierUnits},
)
