"""What a quantized tensor holding its two usages apart (block-scaled FP8, NVFP4, hybrid) answers
of them: TE's update_usage and get_usages over the operand's `rowwise` / `columnwise`."""
from typing import Optional


class HeldUsages:
    """A mixin for QuantizedTensors whose operand has `rowwise` and `columnwise` (None where not cast)."""

    def update_usage(self, rowwise_usage: Optional[bool] = None, columnwise_usage: Optional[bool] = None) -> None:
        """Drops a usage (False); asking for one that was not cast (True) raises: the values it
        would be cast from are gone."""
        name = type(self).__name__
        operand = self._storage.operand
        for usage, wanted in (("rowwise", rowwise_usage), ("columnwise", columnwise_usage)):
            if wanted is False:
                setattr(operand, usage, None)
            elif wanted and getattr(operand, usage) is None:
                raise RuntimeError(f"{name}.update_usage: no {usage} data to keep (quantize with {usage}=True)")
        if operand.rowwise is None and operand.columnwise is None:
            raise RuntimeError(f"{name}.update_usage: at least one usage must remain")

    def get_usages(self) -> dict:
        operand = self._storage.operand
        return {"rowwise": operand.rowwise is not None, "columnwise": operand.columnwise is not None}
