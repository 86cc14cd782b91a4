"""Training data for the GPT benchmark: byte-level language modelling over the Python standard
library's own source files. Needs no network and ships no third-party text; the corpus is the
same on every machine with the same Python version.

Corpus: the sorted *.py files directly in os.path.dirname(os.__file__), read as bytes until
max_bytes; every HELD_OUT_EVERY-th file (in sorted order) goes to the held-out split, the rest to
the training split. Each split is one uint8 tensor of the files joined end to end.
Batches: `batch` windows of seq + 1 bytes at offsets drawn from a seeded torch.Generator;
inputs are the first seq bytes, targets the last seq (next-byte prediction).
"""
import os
from dataclasses import dataclass
from pathlib import Path
from typing import Iterator, List, Tuple

import torch

HELD_OUT_EVERY = 10
MAX_BYTES = 2 << 20  # 2 MiB: far more than a benchmark run reads, quick to load


@dataclass(frozen=True)
class Corpus:
    """train, heldout: uint8 [n] byte streams; files: how many source files each split holds."""
    train: torch.Tensor
    heldout: torch.Tensor
    train_files: int
    heldout_files: int
    source: str

    def describe(self) -> dict:
        return dict(source=self.source, train_bytes=self.train.numel(), heldout_bytes=self.heldout.numel(),
                    train_files=self.train_files, heldout_files=self.heldout_files)


def stdlib_files(directory: Path = Path(os.path.dirname(os.__file__))) -> List[Path]:
    return sorted(path for path in directory.glob("*.py") if path.is_file())


def load_corpus(min_window: int, max_bytes: int = MAX_BYTES) -> Corpus:
    """The corpus, or ValueError when either split is shorter than min_window bytes (a
    window is seq + 1 bytes)."""
    files = stdlib_files()
    train: List[bytes] = []
    heldout: List[bytes] = []
    total = 0
    for index, path in enumerate(files):
        if total >= max_bytes:
            break
        data = path.read_bytes()[:max_bytes - total]
        total += len(data)
        (heldout if index % HELD_OUT_EVERY == HELD_OUT_EVERY - 1 else train).append(data)
    corpus = Corpus(train=_bytes_tensor(b"".join(train)), heldout=_bytes_tensor(b"".join(heldout)),
                    train_files=len(train), heldout_files=len(heldout), source=str(files[0].parent) if files else "")
    shortest = min(corpus.train.numel(), corpus.heldout.numel())
    if shortest < min_window:
        raise ValueError(f"standard-library corpus in {corpus.source!r}: a split has {shortest} bytes, "
                         f"fewer than one window of seq + 1 = {min_window}")
    return corpus


def _bytes_tensor(data: bytes) -> torch.Tensor:
    return torch.frombuffer(bytearray(data), dtype=torch.uint8) if data else torch.empty(0, dtype=torch.uint8)


def batches(stream: torch.Tensor, batch: int, seq: int, seed: int,
            device: torch.device) -> Iterator[Tuple[torch.Tensor, torch.Tensor]]:
    """Endless (inputs, targets), both int64 [batch, seq] on device, from random windows of the
    uint8 stream; the same seed gives the same batches."""
    generator = torch.Generator().manual_seed(seed)
    span = torch.arange(seq + 1)
    while True:
        starts = torch.randint(0, stream.numel() - seq, (batch, 1), generator=generator)
        windows = stream[starts + span].long().to(device)  # [batch, seq + 1]
        yield windows[:, :-1], windows[:, 1:]
