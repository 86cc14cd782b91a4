"""te.ops in TE's op protocol: ops written as op_forward / op_backward or fuser_forward /
fuser_backward, the user fusions registered for the forward, the backward or both, and named
extra-tensor channels. Each pipeline is checked against the same computation in plain PyTorch
(forward and every gradient); this package's own ops inside such a pipeline give the bits
they give when called one by one, in high precision and under FP8."""
import pytest
import torch

import transformer_engine.pytorch as te
from transformer_engine.common import recipe
from transformer_engine.pytorch import ops
from transformer_engine.pytorch.ops import fusion_registry
from transformer_engine.pytorch.ops.fuser import OperationFuser

H = 32


@pytest.fixture(autouse=True)
def fresh_fusion_registry(monkeypatch):
    """Each test registers into its own copies of the lists (they are process-wide)."""
    for name in ("_JOINT", "_FORWARD", "_BACKWARD"):
        monkeypatch.setattr(fusion_registry, name, list(getattr(fusion_registry, name)))


class Scale(ops.BasicOperation):
    """y = w * x with a learnable scalar w, in TE's op protocol."""

    def __init__(self, device, dtype=torch.float32):
        super().__init__()
        self.w = torch.nn.Parameter(torch.tensor(1.5, device=device, dtype=dtype))

    def op_forward(self, ctx, input_, **unused):
        ctx.save_for_backward(input_)
        return self.w * input_

    def op_backward(self, ctx, grad_output):
        (x,) = ctx.saved_tensors
        return self.w * grad_output, ((grad_output * x).sum(),)


class RowNormBranch(ops.BasicOperation):
    """Passes x on and gives its per-row mean square as an extra output (TE protocol)."""
    num_extra_outputs = 1

    def fuser_forward(self, basic_op_ctxs, input_, *, basic_op_extra_inputs, **unused):
        basic_op_ctxs[0].save_for_backward(input_)
        return input_, [(input_.square().mean(-1),)]

    def fuser_backward(self, basic_op_ctxs, grad_output, *, basic_op_grad_extra_outputs):
        (x,) = basic_op_ctxs[0].saved_tensors
        (g,) = basic_op_grad_extra_outputs[0]
        extra = 0 if g is None else g.unsqueeze(-1) * 2 * x / x.shape[-1]
        return grad_output + extra, [()], [()]


class ScaleRows(ops.BasicOperation):
    """x * s[..., None] for an extra input s (TE protocol)."""
    num_extra_inputs = 1

    def fuser_forward(self, basic_op_ctxs, input_, *, basic_op_extra_inputs, **unused):
        (s,) = basic_op_extra_inputs[0]
        basic_op_ctxs[0].save_for_backward(input_, s)
        basic_op_ctxs[0].s_needs_grad = s.requires_grad
        return input_ * s.unsqueeze(-1), [()]

    def fuser_backward(self, basic_op_ctxs, grad_output, *, basic_op_grad_extra_outputs):
        x, s = basic_op_ctxs[0].saved_tensors
        ds = (grad_output * x).sum(-1) if basic_op_ctxs[0].s_needs_grad else None
        return grad_output * s.unsqueeze(-1), [()], [(ds,)]


def leaf(t):
    return t.detach().clone().requires_grad_()


def grads_of(outputs, tensors, seed=0):
    gen = torch.Generator().manual_seed(seed)
    outputs = outputs if isinstance(outputs, tuple) else (outputs,)
    dys = [torch.randn(o.shape, generator=gen).to(o) for o in outputs]
    return [g for g in torch.autograd.grad(outputs, tensors, dys, allow_unused=True)]


def test_protocol_op_between_our_ops_matches_plain_pytorch(device):
    torch.manual_seed(0)
    lin = ops.Linear(H, H, device=device)
    scale = Scale(device)
    act = ops.GELU()
    model = ops.Sequential(lin, scale, act)
    x = torch.randn(5, 3, H, device=device)
    xs = leaf(x)
    y = model(xs)
    params = [lin.weight, lin.bias, scale.w]
    got = grads_of(y, [xs, *params])
    xr = leaf(x)
    y_ref = torch.nn.functional.gelu(scale.w * torch.nn.functional.linear(xr, lin.weight, lin.bias), approximate="tanh")
    want = grads_of(y_ref, [xr, *params])
    torch.testing.assert_close(y, y_ref)
    for g, w in zip(got, want):
        torch.testing.assert_close(g, w)
    assert [type(u).__name__ for u, _ in model._module_groups[0]._forward_ops] == ["Linear", "Scale", "GELU"]


@pytest.mark.parametrize("fp8_recipe", [None, recipe.Float8CurrentScaling(), recipe.MXFP8BlockScaling()],
                         ids=["high_precision", "current_scaling", "mxfp8"])
def test_our_ops_in_a_protocol_pipeline_give_their_own_bits(fp8_recipe):
    """A protocol op forces the whole group onto the pipeline: our ops there run unfused, each on
    its recorded graph, so they equal the ops called one by one, bit for bit."""
    torch.manual_seed(1)
    norm, lin1, act, lin2 = ops.RMSNorm(H), ops.Linear(H, 2 * H), ops.SwiGLU(), ops.Linear(H, H)
    scale = Scale("cpu")
    x = torch.randn(64, H)

    def step(call):
        xs = leaf(x)
        with te.autocast(enabled=fp8_recipe is not None, recipe=fp8_recipe):
            y = call(xs)
        params = [norm.weight, lin1.weight, lin1.bias, lin2.weight, lin2.bias, scale.w]
        return [y, *grads_of(y, [xs, *params])]

    pipeline = ops.Sequential(norm, lin1, act, lin2, scale)
    by_pipeline = step(pipeline)
    one_by_one = step(lambda v: scale(lin2(act(lin1(norm(v))))))
    for a, b in zip(by_pipeline, one_by_one):
        assert torch.equal(a, b)


def test_named_channels_route_a_residual_and_a_hidden_branch():
    torch.manual_seed(2)
    keep, lin, add = ops.MakeExtraOutput(), ops.Linear(H, H), ops.AddExtraInput()
    branch, scale_rows = RowNormBranch(), ScaleRows()
    keep.set_extra_output_channel(0, "residual", output_to_caller=False)
    add.set_extra_input_channel(0, "residual")
    branch.set_extra_output_channel(0, "ms")  # also returned to the caller
    scale_rows.set_extra_input_channel(0, "ms")
    outside = ops.AddExtraInput()  # unbound: takes the caller's extra input
    model = ops.Sequential(keep, lin, add, branch, scale_rows, outside)
    x, extra = torch.randn(7, H), torch.randn(7, H)
    xs, es = leaf(x), leaf(extra)
    y, ms = model(xs, es)
    got = grads_of((y, ms), [xs, es, lin.weight, lin.bias])

    xr, er = leaf(x), leaf(extra)
    h = torch.nn.functional.linear(xr, lin.weight, lin.bias) + xr
    ms_ref = h.square().mean(-1)
    y_ref = h * ms_ref.unsqueeze(-1) + er
    want = grads_of((y_ref, ms_ref), [xr, er, lin.weight, lin.bias])
    torch.testing.assert_close(y, y_ref)
    torch.testing.assert_close(ms, ms_ref)
    for g, w in zip(got, want):
        torch.testing.assert_close(g, w)


def test_a_channel_feeds_every_later_reader_and_a_hidden_unread_one_is_dropped():
    make, first, second = ops.MakeExtraOutput(), ops.AddExtraInput(), ops.AddExtraInput()
    make.set_extra_output_channel(0, "x", output_to_caller=False)
    first.set_extra_input_channel(0, "x")
    second.set_extra_input_channel(0, "x")
    unread = ops.MakeExtraOutput().set_extra_output_channel(0, "nobody", output_to_caller=False)
    model = ops.Sequential(make, first, second, unread)
    x = leaf(torch.randn(4, H))
    y = model(x)
    assert isinstance(y, torch.Tensor)
    torch.testing.assert_close(y, 3 * x)
    (dx,) = torch.autograd.grad(y, x, torch.ones_like(y))
    torch.testing.assert_close(dx, torch.full_like(x, 3.0))
    with torch.no_grad():  # no graph: the same values
        torch.testing.assert_close(model(x), 3 * x)


@pytest.mark.parametrize("kind", ["forward", "backward", "joint"])
def test_user_fusions_replace_their_ops_in_the_passes_they_name(kind):
    """A fusion of (ConstantScale, Linear without bias) whose passes compute what the two ops do."""
    calls = {"forward": 0, "backward": 0}

    class ScaledLinear(ops.FusedOperation):
        def fuser_forward(self, basic_op_ctxs, input_, *, basic_op_extra_inputs, basic_op_kwargs, **unused):
            calls["forward"] += 1
            scale, linear = self.basic_ops
            x = scale.scale * input_
            basic_op_ctxs[1].save_for_backward(x, linear.weight)
            basic_op_ctxs[1].with_quantized_compute = False
            return x @ linear.weight.t(), [(), ()]

        def fuser_backward(self, basic_op_ctxs, grad_output, *, basic_op_grad_extra_outputs):
            calls["backward"] += 1
            scale, _ = self.basic_ops
            x, weight = basic_op_ctxs[1].saved_tensors
            return scale.scale * (grad_output @ weight), [(), (grad_output.t() @ x,)], [(), ()]

    def fuse(op_list, recipe=None):
        out, i = [], 0
        while i < len(op_list):
            pair = op_list[i:i + 2]
            if (len(pair) == 2 and isinstance(pair[0], ops.ConstantScale) and isinstance(pair[1], ops.Linear)
                    and not pair[1].use_bias):
                out.append(ScaledLinear(pair))
                i += 2
            else:
                out.append(op_list[i])
                i += 1
        return out

    {"forward": ops.register_forward_fusion, "backward": ops.register_backward_fusion,
     "joint": ops.register_forward_backward_fusion}[kind](fuse)
    torch.manual_seed(3)
    lin = ops.Linear(H, H, bias=False)
    model = ops.Sequential(ops.ConstantScale(0.75), lin, ops.GELU())
    x = torch.randn(6, H)
    xs = leaf(x)
    y = model(xs)
    got = grads_of(y, [xs, lin.weight])
    xr = leaf(x)
    y_ref = torch.nn.functional.gelu(torch.nn.functional.linear(0.75 * xr, lin.weight), approximate="tanh")
    want = grads_of(y_ref, [xr, lin.weight])
    torch.testing.assert_close(y, y_ref)
    for g, w in zip(got, want):
        torch.testing.assert_close(g, w)
    group = model._module_groups[0]
    forward_fused = kind in ("forward", "joint")
    backward_fused = kind in ("backward", "joint")
    assert isinstance(group._forward_ops[0][0], ScaledLinear) == forward_fused
    assert isinstance(group._backward_ops[0][0], ScaledLinear) == backward_fused
    assert calls == {"forward": int(forward_fused), "backward": int(backward_fused)}


def test_a_fusion_that_does_not_cover_the_ops_in_order_is_refused():
    ops.register_forward_fusion(lambda op_list, recipe=None: list(reversed(op_list)))
    model = ops.Sequential(ops.ConstantScale(2.0), ops.Identity())
    with pytest.raises(RuntimeError, match="do not cover"):
        model(torch.randn(2, H))


def test_channel_bindings_are_checked_and_lock_once_routed():
    producer, consumer = ops.MakeExtraOutput(), ops.AddExtraInput()
    with pytest.raises(IndexError, match="out of range"):
        producer.set_extra_output_channel(1, "r")
    with pytest.raises(IndexError, match="out of range"):
        consumer.set_extra_input_channel(-1, "r")
    with pytest.raises(ValueError, match="non-empty string"):
        consumer.set_extra_input_channel(0, "")
    with pytest.raises(TypeError, match="output_to_caller"):
        producer.set_extra_output_channel(0, "r", output_to_caller="yes")
    consumer.set_extra_input_channel(0, "r")
    with pytest.raises(ValueError, match="has no producer"):
        OperationFuser([consumer])
    late = ops.MakeExtraOutput().set_extra_output_channel(0, "r")
    with pytest.raises(ValueError, match="no earlier producer"):
        OperationFuser([consumer, late])
    twice = ops.MakeExtraOutput().set_extra_output_channel(0, "r")
    producer.set_extra_output_channel(0, "r")
    with pytest.raises(ValueError, match="multiple producers"):
        OperationFuser([producer, twice, consumer])
    fuser = OperationFuser([producer, consumer])
    assert fuser.num_extra_inputs == 0 and fuser._basic_op_extra_input_sources == [[], [(0, 0)]]
    with pytest.raises(RuntimeError, match="already captured"):
        producer.set_extra_output_channel(0, None)


def test_a_fused_op_must_give_the_outputs_others_read():
    class DropsBranch(ops.FusedOperation):
        def fuser_forward(self, basic_op_ctxs, input_, **unused):
            return input_, [(None,)]

    ops.register_forward_fusion(lambda op_list, recipe=None: [DropsBranch(op_list[:1]), *op_list[1:]]
                                if isinstance(op_list[0], ops.MakeExtraOutput) else op_list)
    make, add = ops.MakeExtraOutput(), ops.AddExtraInput()
    make.set_extra_output_channel(0, "r", output_to_caller=False)
    add.set_extra_input_channel(0, "r")
    with pytest.raises(RuntimeError, match="outside its forward fusion"):
        ops.Sequential(make, add)(torch.randn(2, H))


def test_a_protocol_op_called_alone_and_without_its_methods():
    scale = Scale("cpu")
    x = leaf(torch.randn(3, H))
    y = scale(x)
    (dw,) = torch.autograd.grad(y, scale.w, torch.ones_like(y))
    torch.testing.assert_close(dw, x.sum())

    class Empty(ops.BasicOperation):
        pass

    with pytest.raises(NotImplementedError, match="neither forward nor op_forward"):
        Empty()(x)


def test_a_residual_channel_between_our_ops_keeps_their_fusions_and_compiles():
    """Channels alone need no protocol: the group stays on our fused units (the residual + RMSNorm
    kernel, the GEMM with the add), matches plain PyTorch, and torch.compile(fullgraph=True)
    gives eager's bits."""
    torch.manual_seed(5)
    keep, norm, lin, add = ops.MakeExtraOutput(), ops.RMSNorm(H), ops.Linear(H, H, bias=False), ops.AddExtraInput()
    keep.set_extra_output_channel(0, "residual", output_to_caller=False)
    add.set_extra_input_channel(0, "residual")
    model = ops.Sequential(keep, norm, lin, add)
    x = torch.randn(6, H)
    xs = leaf(x)
    y = model(xs)
    got = grads_of(y, [xs, norm.weight, lin.weight])
    assert [type(u).__name__ for u, _ in model._module_groups[0]._forward_ops] == ["BackwardAddRMSNorm",
                                                                                  "ForwardLinearBiasAdd"]
    xr = leaf(x)
    normed = xr * torch.rsqrt(xr.square().mean(-1, keepdim=True) + norm.eps) * norm.weight
    y_ref = torch.nn.functional.linear(normed, lin.weight) + xr
    want = grads_of(y_ref, [xr, norm.weight, lin.weight])
    torch.testing.assert_close(y, y_ref)
    for g, w in zip(got, want):
        torch.testing.assert_close(g, w)
    compiled = torch.compile(model, fullgraph=True)
    xc = leaf(x)
    yc = compiled(xc)
    assert torch.equal(yc, y)
    for g, w in zip(grads_of(yc, [xc, norm.weight, lin.weight]), got):
        assert torch.equal(g, w)


def test_user_fusions_are_asked_again_when_the_recipe_kind_changes():
    seen = []

    def note_recipe(op_list, recipe=None):
        seen.append(type(recipe).__name__)
        return op_list

    ops.register_forward_fusion(note_recipe)
    model = ops.Sequential(ops.Linear(H, H))
    x = torch.randn(4, H)
    model(x)
    model(x)  # cached: not asked again
    with te.autocast(recipe=recipe.Float8CurrentScaling()):
        model(x)
    assert seen == ["NoneType", "Float8CurrentScaling"]


def test_delayed_scaling_state_moves_as_one_by_one_over_steps():
    """Under DelayedScaling our ops' FP8 state (amax histories, scales) is updated inside the
    pipeline as when the ops are called alone: three steps stay bit for bit equal."""
    import copy
    torch.manual_seed(6)
    ours = [ops.RMSNorm(H), ops.Linear(H, 2 * H), ops.GELU(), ops.Linear(2 * H, H), Scale("cpu")]
    alone = copy.deepcopy(ours)
    pipeline = ops.Sequential(*ours)

    def one_by_one(v):
        for op in alone:
            v = op(v)
        return v
    for _ in range(3):
        x = torch.randn(16, H)
        results = []
        for call, modules in ((pipeline, ours), (one_by_one, alone)):
            xs = leaf(x)
            with te.autocast(recipe=recipe.DelayedScaling()):
                y = call(xs)
            results.append([y, *grads_of(y, [xs, *[p for m in modules for p in m.parameters()]])])
        for a, b in zip(*results):
            assert torch.equal(a, b)
