"""FunctionLog: a __torch_function__ mode recording what is called inside it, for tests that
check an op stays visible to such modes (the direct dispatcher calls step aside for them)."""
from torch.overrides import TorchFunctionMode


class FunctionLog(TorchFunctionMode):
    """str() of every function called inside it, in order, in `names`."""

    def __init__(self):
        super().__init__()
        self.names = []

    def __torch_function__(self, func, types, args=(), kwargs=None):
        self.names.append(str(func))
        return func(*args, **(kwargs or {}))
