"""What every optimizer's step does with its closure."""
from typing import Callable, Optional

import torch


def evaluate_closure(closure: Optional[Callable]):
    """closure() with gradients enabled (a step runs under no_grad), or None without one."""
    if closure is None:
        return None
    with torch.enable_grad():
        return closure()
