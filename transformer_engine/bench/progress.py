"""Progress of a run on stderr, so stdout keeps only the result table.

Nothing is shown during the first DELAY_S seconds (short runs stay quiet). On a terminal the
progress is one line redrawn in place, cleared before each table line is printed (both streams
share the screen); elsewhere (a log file) it is a plain line per case.
"""
import sys
import time
from typing import Optional, TextIO

DELAY_S = 3.0


class Progress:
    def __init__(self, total: int, stream: Optional[TextIO] = None):
        self.total, self.stream = total, stream if stream is not None else sys.stderr
        self.start = time.monotonic()
        self.in_place = self.stream.isatty()
        self.drawn = 0  # characters of the in-place line now on screen

    def show(self, done: int, label: str) -> None:
        """Reports that `done` of `total` cases are finished and `label` runs next."""
        elapsed = time.monotonic() - self.start
        if elapsed < DELAY_S:
            return
        text = f"[{done}/{self.total}] {elapsed:.0f} s  running {label}"
        if self.in_place:
            self.clear()
            self.stream.write("\r" + text)
            self.drawn = len(text)
        else:
            self.stream.write(text + "\n")
        self.stream.flush()

    def clear(self) -> None:
        """Erases the in-place line, if one is drawn."""
        if self.drawn:
            self.stream.write("\r" + " " * self.drawn + "\r")
            self.stream.flush()
            self.drawn = 0
