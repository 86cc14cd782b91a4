"""TE's torch_version(): the running PyTorch's release numbers, e.g. (2, 13, 0) for
"2.13.0+cpu" (the local and pre-release parts dropped, as packaging's Version.release)."""
import functools
import re
from typing import Tuple

import torch


@functools.lru_cache(maxsize=None)
def torch_version() -> Tuple[int, ...]:
    release = re.match(r"\d+(\.\d+)*", str(torch.__version__)).group(0)
    return tuple(int(part) for part in release.split("."))
