"""te.checkpoint: gradients bit-identical to the same step without checkpointing (fp32, FP8),
the FP8 state after each step identical too (no second amax, no second update), dropout
replayed, both torch modes, tuples / non-tensor args / kwargs, the RNG tracker, refusals."""
import copy

import pytest
import torch

import transformer_engine.pytorch as te
from transformer_engine.common import recipe

MODES = pytest.mark.parametrize("use_reentrant", [True, False], ids=["reentrant", "non_reentrant"])


class Mlp(torch.nn.Module):
    """norm -> fc1 -> gelu -> dropout -> fc2, of te modules."""

    def __init__(self, hidden=32, ffn=48, dropout=0.0):
        super().__init__()
        self.norm = te.LayerNorm(hidden)
        self.fc1 = te.Linear(hidden, ffn)
        self.fc2 = te.Linear(ffn, hidden)
        self.dropout = dropout

    def forward(self, x, scale=1.0):
        h = torch.nn.functional.gelu(self.fc1(self.norm(x)))
        return self.fc2(torch.nn.functional.dropout(h, self.dropout, training=self.training)) * scale


def run_steps(model, inputs, checkpointed, use_reentrant, rec=None):
    """Forward+backward per input (under te.autocast(recipe=rec) when rec is given), returning
    per step the output, input gradient, parameter gradients and FP8 state of each Linear."""
    results = []
    for x in inputs:
        model.zero_grad(set_to_none=True)
        x = x.clone().requires_grad_()
        with te.autocast(enabled=rec is not None, recipe=rec or recipe.DelayedScaling()):
            if checkpointed == "torch":  # as Hugging Face's gradient checkpointing calls it
                y = torch.utils.checkpoint.checkpoint(model, x, use_reentrant=use_reentrant)
            elif checkpointed:
                y = te.checkpoint(model, x, use_reentrant=use_reentrant)
            else:
                y = model(x)
        y.square().sum().backward()
        fp8_state = {name: {key: value.clone() for key, value in module.fp8_meta.extra_state().items()
                            if torch.is_tensor(value)}
                     for name, module in model.named_modules()
                     if getattr(module, "fp8_meta", None) is not None}
        results.append((y.detach(), x.grad, {n: p.grad.clone() for n, p in model.named_parameters()}, fp8_state))
    return results


def assert_identical(got, want):
    assert len(got) == len(want)
    for step, ((y1, dx1, grads1, state1), (y2, dx2, grads2, state2)) in enumerate(zip(got, want)):
        assert torch.equal(y1, y2), f"step {step}: output"
        assert torch.equal(dx1, dx2), f"step {step}: input gradient"
        assert grads1.keys() == grads2.keys()
        for name in grads1:
            assert torch.equal(grads1[name], grads2[name]), f"step {step}: gradient of {name}"
        assert state1.keys() == state2.keys()
        for module in state1:
            for key in state1[module]:
                assert torch.equal(state1[module][key], state2[module][key]), f"step {step}: {module} {key}"


class NormMlp(torch.nn.Module):
    """te.LayerNormMLP then a te.GroupedLinear over two splits of the tokens."""

    def __init__(self, hidden=32):
        super().__init__()
        self.mlp = te.LayerNormMLP(hidden, 48)
        self.experts = te.GroupedLinear(2, hidden, hidden)

    def forward(self, x):
        h = self.mlp(x).reshape(-1, x.shape[-1])  # [b, s, hidden] -> [tokens, hidden]
        return self.experts(h, [h.shape[0] - 16, 16]).reshape(x.shape)


class OpsMlp(torch.nn.Module):
    """A te.ops.Sequential: RMSNorm -> Linear (fused: the norm writes the GEMM's FP8 input),
    GELU, Linear."""

    def __init__(self, hidden=32):
        super().__init__()
        self.ops = te.ops.Sequential(te.ops.RMSNorm(hidden), te.ops.Linear(hidden, 48), te.ops.GELU(),
                                     te.ops.Linear(48, hidden))

    def forward(self, x):
        return self.ops(x)


@MODES
def test_high_precision_gradients_bit_identical(use_reentrant):
    model = Mlp()
    inputs = [torch.randn(2, 5, 32)]
    assert_identical(run_steps(model, inputs, True, use_reentrant), run_steps(model, inputs, False, use_reentrant))


@MODES
@pytest.mark.parametrize("rec", [recipe.DelayedScaling(margin=1, amax_history_len=4), recipe.Float8CurrentScaling()],
                         ids=["delayed", "current"])
@pytest.mark.parametrize("make", [Mlp, NormMlp], ids=["linear", "layernorm_mlp_grouped"])
def test_fp8_gradients_and_state_bit_identical_over_steps(make, rec, use_reentrant):
    """Inputs of growing magnitude make every delayed-scaling update change the scales, so a
    recompute with the updated scales, or a second amax, would show. LayerNormMLP casts its
    inputs in the fused norm / activation -> FP8 kernels, which read the scales themselves."""
    torch.manual_seed(0)
    reference = make()
    model = copy.deepcopy(reference)
    inputs = [torch.randn(2, 16, 32) * (1 + 3 * step) for step in range(4)]
    got = run_steps(model, inputs, True, use_reentrant, rec)
    want = run_steps(reference, inputs, False, use_reentrant, rec)
    assert_identical(got, want)
    scale = next(m for m in model.modules() if getattr(m, "fp8_meta", None) is not None).fp8_meta["scaling_fwd"].scale
    if rec.delayed():  # the scales did move from step to step
        assert not torch.equal(scale, torch.ones_like(scale))


@MODES
@pytest.mark.parametrize("make", [Mlp, NormMlp, OpsMlp], ids=["linear", "layernorm_mlp_grouped", "te_ops"])
@pytest.mark.parametrize("rec", [recipe.DelayedScaling(margin=1, amax_history_len=4), recipe.MXFP8BlockScaling()],
                         ids=["delayed", "mxfp8"])
def test_torch_utils_checkpoint_under_fp8(make, rec, use_reentrant):
    """torch.utils.checkpoint (Hugging Face's gradient checkpointing), which knows nothing of
    te.autocast, recomputes in backward outside every region: the modules repeat their FP8
    forward with that forward's scales, so gradients and FP8 state equal the step without it."""
    torch.manual_seed(0)
    reference = make()
    model = copy.deepcopy(reference)
    inputs = [torch.randn(2, 16, 32) * (1 + 3 * step) for step in range(3)]
    got = run_steps(model, inputs, "torch", use_reentrant, rec)
    want = run_steps(reference, inputs, False, use_reentrant, rec)
    assert_identical(got, want)


@MODES
def test_torch_utils_checkpoint_after_fp8_steps_recomputes_in_high_precision(use_reentrant):
    """A module remembers its last forward for a recompute: after FP8 steps, a step without
    te.autocast recomputes in high precision (as that forward ran), not with the FP8 record,
    and leaves the FP8 state alone."""
    torch.manual_seed(0)
    reference = Mlp()
    model = copy.deepcopy(reference)
    inputs = [torch.randn(2, 16, 32) * (1 + 3 * step) for step in range(2)]
    rec = recipe.DelayedScaling(margin=1, amax_history_len=4)
    assert_identical(run_steps(model, inputs, "torch", use_reentrant, rec),
                     run_steps(reference, inputs, False, use_reentrant, rec))
    assert_identical(run_steps(model, inputs, "torch", use_reentrant),
                     run_steps(reference, inputs, False, use_reentrant))


@MODES
def test_checkpoint_outside_autocast_with_autocast_inside(use_reentrant):
    """The function opens its own te.autocast: its exit after the recompute must not update
    the scales a second time."""
    rec = recipe.DelayedScaling(amax_history_len=3)
    reference = Mlp()
    model = copy.deepcopy(reference)

    def step(module, x, checkpointed):
        def body(inp):
            with te.autocast(recipe=rec):
                return module(inp)
        x = x.clone().requires_grad_()
        (te.checkpoint(body, x, use_reentrant=use_reentrant) if checkpointed else body(x)).sum().backward()
        return x.grad

    for k in range(3):
        x = torch.randn(4, 32) * (k + 1)
        assert torch.equal(step(model, x, True), step(reference, x, False))
        for name in ("fc1", "fc2"):
            ours, theirs = getattr(model, name).fp8_meta, getattr(reference, name).fp8_meta
            for key in ("amax_history", "scale", "scale_inv"):
                assert torch.equal(getattr(ours.scaling_fwd, key), getattr(theirs.scaling_fwd, key)), (k, name, key)


@MODES
def test_dropout_replays_the_same_mask(use_reentrant):
    model = Mlp(dropout=0.5).train()
    x = torch.randn(6, 32)
    torch.manual_seed(7)
    want = run_steps(model, [x], False, use_reentrant)
    torch.manual_seed(7)
    got = run_steps(model, [x], True, use_reentrant)
    assert_identical(got, want)


@MODES
def test_tuples_non_tensor_args_and_kwargs(use_reentrant):
    linear = te.Linear(8, 8)

    def function(a, flag, b, *, scale, bias_tensor=None):
        out = linear(a) * scale + b
        if flag == "twice":
            out = out * 2
        return out + bias_tensor, out.sum(), "label"

    a, b, extra = torch.randn(3, 8), torch.randn(3, 8), torch.randn(8)

    def grads(checkpointed):
        linear.zero_grad(set_to_none=True)
        inputs = [t.clone().requires_grad_() for t in (a, b, extra)]
        call = te.checkpoint if checkpointed else (lambda f, *args, use_reentrant, **kw: f(*args, **kw))
        out, total, label = call(function, inputs[0], "twice", inputs[1], use_reentrant=use_reentrant, scale=0.5,
                                 bias_tensor=inputs[2])
        assert label == "label"
        (out.square().sum() + total).backward()
        return [t.grad for t in inputs] + [linear.weight.grad, linear.bias.grad]

    for got, want in zip(grads(True), grads(False)):
        assert torch.equal(got, want)


class Tracker:
    """Megatron's RNG tracker interface: named generator states, get_states / set_states."""

    def __init__(self):
        self.states = {"model-parallel-rng": torch.Generator().manual_seed(3).get_state()}

    def get_states(self):
        return dict(self.states)

    def set_states(self, states):
        self.states = dict(states)

    def randn(self, *shape):
        generator = torch.Generator()
        generator.set_state(self.states["model-parallel-rng"])
        out = torch.randn(*shape, generator=generator)
        self.states["model-parallel-rng"] = generator.get_state()
        return out


@MODES
def test_rng_tracker_states_restored_for_recompute(use_reentrant):
    tracker = Tracker()
    x = torch.randn(4, 6, requires_grad=True)
    noise = []

    def function(inp):
        n = tracker.randn(4, 6)
        noise.append(n)
        return inp * n

    te.checkpoint(function, x, get_rng_state_tracker=lambda: tracker, use_reentrant=use_reentrant).sum().backward()
    assert len(noise) == 2 and torch.equal(noise[0], noise[1])  # the recompute drew the same numbers
    assert torch.equal(x.grad, noise[0])
    after = tracker.get_states()["model-parallel-rng"]
    tracker_once = Tracker()
    tracker_once.randn(4, 6)
    assert torch.equal(after, tracker_once.states["model-parallel-rng"])  # advanced once, not twice


def test_no_grad_just_calls_and_legacy_positional_form():
    linear = te.Linear(4, 3)
    x = torch.randn(2, 4)
    with torch.no_grad():
        assert torch.equal(te.checkpoint(linear, x), linear(x))
    xg = x.clone().requires_grad_()
    with pytest.warns(DeprecationWarning, match="keyword"):
        y = te.checkpoint(linear, False, None, None, xg)
    assert torch.equal(y, linear(x))
    y.sum().backward()
    assert xg.grad is not None


def test_refusals():
    with pytest.raises(ValueError, match="function must be callable"):
        te.checkpoint(3, torch.randn(2))
    with pytest.raises(ValueError, match="get_rng_state_tracker"):
        te.checkpoint(torch.sin, torch.randn(2, requires_grad=True), get_rng_state_tracker=5)
    assert te.checkpoint is te.distributed.checkpoint


def test_distributing_saved_activations_over_ranks_is_refused(monkeypatch):
    from transformer_engine.pytorch import checkpointing
    x = torch.randn(2, 3, requires_grad=True)
    # one rank (no process group here): nothing to distribute, runs as usual
    te.checkpoint(torch.sin, x, distribute_saved_activations=True).sum().backward()
    assert torch.equal(x.grad, torch.cos(x.detach()))
    monkeypatch.setattr(checkpointing, "_group_size", lambda group: 2)  # as if tp_group had two ranks
    with pytest.raises(NotImplementedError, match="2 ranks"):
        te.checkpoint(torch.sin, x, distribute_saved_activations=True, tp_group=object())
    te.checkpoint(torch.sin, x, tp_group=object())  # without distributing, the group is not needed


class BiasReturning(torch.nn.Module):
    """te.Linear(return_bias=True) returns its bias parameter itself (fp32), as Megatron's
    layers use it: the checkpointed function then returns a parameter."""

    def __init__(self):
        super().__init__()
        self.fc = te.LayerNormLinear(32, 32, return_bias=True)

    def forward(self, x):
        return self.fc(x)


@MODES
@pytest.mark.parametrize("rec", [None, recipe.DelayedScaling(amax_history_len=2)], ids=["fp32", "delayed"])
def test_function_returning_a_parameter(rec, use_reentrant):
    """Two checkpointed layers that each return (y, bias parameter): the backward ends (the
    reentrant mode used to re-enter its own checkpoint forever) and gradients equal those
    without checkpointing."""
    torch.manual_seed(0)
    reference = torch.nn.ModuleList([BiasReturning(), BiasReturning()])
    model = copy.deepcopy(reference)
    x = torch.randn(4, 32)
    results = []
    for layers, checkpointed in ((reference, False), (model, True)):
        inp = x.clone().requires_grad_()
        with te.autocast(enabled=rec is not None, recipe=rec or recipe.DelayedScaling()):
            h = inp
            for layer in layers:
                y, bias = te.checkpoint(layer, h, use_reentrant=use_reentrant) if checkpointed else layer(h)
                h = y + bias
        h.square().sum().backward()
        results.append([inp.grad] + [p.grad for p in layers.parameters()])
    for got, want in zip(results[1], results[0]):
        assert torch.equal(got, want)
