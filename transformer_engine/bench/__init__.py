"""Benchmarks: our fused ops against PyTorch eager and torch.compile, timed interleaved in one
process, with achieved GB/s against a same-run copy bandwidth.

    python -m transformer_engine.bench [--quick] [--out DIR]
"""
