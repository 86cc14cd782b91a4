"""python -m transformer_engine.bench [--quick] [--out DIR] | list ... | run ...

The te-bench command (cli.py). Without a subcommand this runs every op family's suite on the
default device (the accelerator if present, else the CPU), the full one unless --quick, prints
a table as it goes and writes DIR/<family>_<device>.json and .csv (overwriting them), then the
geometric means of our speedups and bandwidth fractions per family and overall
(DIR/summary_<device>.json).
"""
import sys

from .cli import build_parser, main  # noqa: F401  (build_parser: the parser, for tests and docs)

if __name__ == "__main__":
    sys.exit(main(prog="python -m transformer_engine.bench", default_quick=False))
