"""Named extra-tensor channels between the operations of one pipeline (TE main's
set_extra_output_channel / set_extra_input_channel).

An op's extra output slot bound to a channel feeds every later op's extra input slot bound to
the same name, inside the pipeline, instead of going back to the caller (it still does when
output_to_caller is True, the default). Unbound slots stay public: extra inputs come from the
caller in op order, extra outputs go back after the output. Bindings freeze once a pipeline
has routed them (ChannelBindings.locked)."""
from dataclasses import dataclass
from typing import Dict, List, Optional, Sequence, Tuple

Slot = Tuple[int, int]  # (index of the basic op in the pipeline, index of its extra slot)


@dataclass
class ChannelBindings:
    """One op's bindings: a channel name (or None) per extra input and extra output slot."""
    inputs: List[Optional[str]]
    outputs: List[Optional[str]]
    output_to_caller: List[bool]
    locked: bool = False

    @classmethod
    def unbound(cls, num_extra_inputs: int, num_extra_outputs: int) -> "ChannelBindings":
        return cls([None] * num_extra_inputs, [None] * num_extra_outputs, [True] * num_extra_outputs)

    def bind_input(self, op_name: str, index: int, channel: Optional[str]) -> None:
        _check_slot(op_name, "input", index, len(self.inputs))
        _check_name(channel)
        self._check_unlocked(op_name)
        self.inputs[index] = channel

    def bind_output(self, op_name: str, index: int, channel: Optional[str], output_to_caller: bool) -> None:
        _check_slot(op_name, "output", index, len(self.outputs))
        _check_name(channel)
        if not isinstance(output_to_caller, bool):
            raise TypeError(f"{op_name}: output_to_caller must be a bool, got {output_to_caller!r}")
        self._check_unlocked(op_name)
        self.outputs[index] = channel
        self.output_to_caller[index] = output_to_caller or channel is None

    def _check_unlocked(self, op_name: str) -> None:
        if self.locked:
            raise RuntimeError(f"{op_name}: a pipeline (OperationFuser or Sequential) has already captured its "
                               f"channel routing; bind channels on new operations before building a pipeline")


def _check_slot(op_name: str, kind: str, index: int, count: int) -> None:
    if not isinstance(index, int) or not 0 <= index < count:
        raise IndexError(f"{op_name}: extra {kind} index {index!r} is out of range (it has {count} extra "
                         f"{kind}s)")


def _check_name(channel) -> None:
    if channel is not None and (not isinstance(channel, str) or not channel):
        raise ValueError(f"an extra-tensor channel must be a non-empty string or None, got {channel!r}")


@dataclass(frozen=True)
class ChannelRouting:
    """Where each extra tensor of a pipeline of basic ops comes from and goes to.

    sources[op][slot]: the producing (op, slot) of a bound extra input, None for a public one;
    external_inputs: the public extra input slots, in the order the caller gives them;
    public_outputs: the extra output slots returned to the caller, in op and slot order;
    consumers[(op, slot)]: the ops reading a bound extra output;
    has_channels: whether any slot is bound at all."""
    sources: Tuple[Tuple[Optional[Slot], ...], ...]
    external_inputs: Tuple[Slot, ...]
    public_outputs: Tuple[Slot, ...]
    consumers: Dict[Slot, Tuple[int, ...]]
    has_channels: bool


def route(ops: Sequence) -> ChannelRouting:
    """The routing of `ops` (basic ops in pipeline order) from their bindings; a name with two
    producers, or bound on an input with no earlier producer, is refused."""
    producers: Dict[str, Slot] = {}
    for i, op in enumerate(ops):
        for s, name in enumerate(op.channel_bindings.outputs):
            if name is None:
                continue
            if name in producers:
                raise ValueError(f"extra-tensor channel {name!r} has multiple producers (ops {producers[name][0]} "
                                 f"and {i}: {type(ops[producers[name][0]]).__name__}, {type(op).__name__})")
            producers[name] = (i, s)
    sources, external, consumers = [], [], {}
    for i, op in enumerate(ops):
        op_sources = []
        for s, name in enumerate(op.channel_bindings.inputs):
            if name is None:
                external.append((i, s))
                op_sources.append(None)
                continue
            producer = producers.get(name)
            if producer is None:
                raise ValueError(f"extra-tensor channel {name!r} read by op {i} ({type(op).__name__}) has no producer")
            if producer[0] >= i:
                raise ValueError(f"extra-tensor channel {name!r} read by op {i} ({type(op).__name__}) has no earlier "
                                 f"producer (op {producer[0]} makes it)")
            op_sources.append(producer)
            consumers[producer] = consumers.get(producer, ()) + (i,)
        sources.append(tuple(op_sources))
    public = tuple((i, s) for i, op in enumerate(ops)
                   for s, to_caller in enumerate(op.channel_bindings.output_to_caller) if to_caller)
    bound = any(name is not None for op in ops
                for name in (*op.channel_bindings.inputs, *op.channel_bindings.outputs))
    return ChannelRouting(tuple(sources), tuple(external), public, consumers, bound)
