"""MXFP8's 32 x 32 weight blocks (TE main: MXFP8Quantizer(with_2d_quantization=True),
MXFP8BlockScaling(enable_2d_quantization=True)): scales and codes against the format's
definition, the two usages one set of codes, TE's scale shapes, which slots of a recipe get
them, and te.Linear's GEMMs on them against float64 products of the dequantised operands."""
import pytest
import torch

import transformer_engine.pytorch as te
from transformer_engine.common import recipe
from transformer_engine.pytorch import MXFP8Quantizer
from transformer_engine.pytorch.quantization import MXFP8BlockScalingRecipeState, QuantizerRole

E4M3 = torch.float8_e4m3fn


def block_scale_codes(x: torch.Tensor) -> torch.Tensor:
    """E8M0 code of each 32 x 32 block (partial blocks at the edges): the smallest power of two
    at least amax / 448, as a biased exponent clamped to [0, 254]; 0 for an all-zero block."""
    rows, cols = x.shape
    padded = torch.zeros(-(-rows // 32) * 32, -(-cols // 32) * 32, dtype=torch.float64)
    padded[:rows, :cols] = x.double().abs()
    amax = padded.reshape(padded.shape[0] // 32, 32, -1, 32).amax(dim=(1, 3))  # [row blocks, col blocks]
    exponent = torch.ceil(torch.log2(amax / 448.0)).clamp(-127, 127)
    return torch.where(amax > 0, exponent + 127, torch.zeros_like(exponent)).to(torch.uint8)


def expand(codes: torch.Tensor, rows: int, cols: int) -> torch.Tensor:
    return codes.repeat_interleave(32, 0).repeat_interleave(32, 1)[:rows, :cols]


@pytest.mark.parametrize("shape", [(64, 64), (96, 160), (45, 70), (1, 33), (320, 32)])
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_codes_and_scales_follow_the_blocks(shape, dtype):
    torch.manual_seed(sum(shape))
    rows, cols = shape
    x = (torch.randn(shape) * torch.logspace(-3, 3, cols)).to(dtype)
    q = MXFP8Quantizer(E4M3, with_2d_quantization=True)(x)
    codes = block_scale_codes(x.float())
    scale = torch.pow(2.0, expand(codes, rows, cols).double() - 127)
    want = (x.double() / scale).float().to(E4M3)
    assert torch.equal(q._rowwise_data.view(torch.uint8), want.view(torch.uint8))
    assert torch.equal(q._columnwise_data.view(torch.uint8), want.view(torch.uint8))
    assert torch.equal(q._rowwise_scale_inv, codes.repeat_interleave(32, 0)[:rows])
    assert torch.equal(q._columnwise_scale_inv, codes.repeat_interleave(32, 1)[:, :cols])
    torch.testing.assert_close(q.dequantize(dtype=torch.float32), (want.double() * scale).float(), rtol=0, atol=0)


def test_rowwise_only_and_the_extremes():
    x = torch.zeros(64, 64)
    x[:32, :32] = 1e-40  # below 448 * 2^-127: the smallest scale, 2^-127
    x[:32, 32:] = 3e38  # near fp32's largest: 2^120, the scale ceil(log2(3e38 / 448)) asks
    x[32:, 32:] = float("nan")
    q = MXFP8Quantizer(E4M3, columnwise=False, with_2d_quantization=True)(x)
    assert q._columnwise_data is None and q._columnwise_scale_inv is None
    scales = q._rowwise_scale_inv[::32].tolist()
    assert scales[0][0] == 0 and scales[0][1] == 120 + 127 and scales[1][0] == 0
    codes = q._rowwise_data.float()
    assert (codes[:32, :32] == torch.tensor(1e-40 * 2.0**127).to(E4M3).float()).all()
    assert (codes[:32, 32:] == 224).all() and (codes[32:, :32] == 0).all()  # 3e38 / 2^120 = 225.7
    assert MXFP8Quantizer(E4M3, with_2d_quantization=True).copy().with_2d_quantization


def test_the_recipe_gives_32_x_32_blocks_to_linear_weights_alone():
    two_d = recipe.MXFP8BlockScaling(enable_2d_quantization=True)
    roles = [QuantizerRole("linear", "input"), QuantizerRole("linear", "weight"), QuantizerRole("linear", "output"),
             QuantizerRole("grouped_linear", "weight"), QuantizerRole("dpa", "weight")]
    forward = MXFP8BlockScalingRecipeState(two_d, mode="forward", num_quantizers=5, roles=roles).make_quantizers()
    assert [q.with_2d_quantization for q in forward] == [False, True, False, True, False]
    backward = MXFP8BlockScalingRecipeState(two_d, mode="backward", num_quantizers=2, roles=roles[:2])
    assert not any(q.with_2d_quantization for q in backward.make_quantizers())
    unnamed = MXFP8BlockScalingRecipeState(two_d, mode="forward", num_quantizers=3)
    assert not any(q.with_2d_quantization for q in unnamed.make_quantizers())
    one_d = MXFP8BlockScalingRecipeState(recipe.MXFP8BlockScaling(), mode="forward", num_quantizers=5, roles=roles)
    assert not any(q.with_2d_quantization for q in one_d.make_quantizers())
    with pytest.raises(ValueError, match="roles"):
        MXFP8BlockScalingRecipeState(two_d, mode="forward", num_quantizers=2, roles=roles)


@pytest.mark.parametrize("two_d", [False, True], ids=["1x32", "32x32"])
def test_linear_multiplies_the_weights_blocks_it_was_given(two_d):
    """Weights whose columns differ by orders of magnitude, so 32 x 32 scales (one for 32 rows
    and columns) and 1 x 32 / 32 x 1 scales give different values: each recipe's GEMMs match
    float64 products of its own dequantised operands, and not the other's."""
    torch.manual_seed(3)
    lin = te.Linear(96, 64, bias=False, params_dtype=torch.float32)
    with torch.no_grad():
        lin.weight.mul_(torch.logspace(-2, 2, 96))
    x = torch.randn(40, 96, requires_grad=True)
    dy = torch.randn(40, 64)
    with te.autocast(recipe=recipe.MXFP8BlockScaling(enable_2d_quantization=two_d)):
        y = lin(x)
    dx, dw = torch.autograd.grad(y, (x, lin.weight), dy)

    def deq(t, **kwargs):
        return MXFP8Quantizer(E4M3, **kwargs)(t.detach())

    qx, qdy = deq(x), deq(dy)
    for weight_2d in (two_d, not two_d):
        qw = deq(lin.weight, with_2d_quantization=weight_2d)
        w_row = qw._storage.operand.rowwise.dequantize().double()
        w_col = qw._storage.operand.columnwise.dequantize().double()
        y_ref = qx.dequantize().double() @ w_row.t()
        dx_ref = qdy.dequantize().double() @ w_col
        close = torch.allclose(y.double(), y_ref, rtol=1e-5, atol=1e-5) and \
            torch.allclose(dx.double(), dx_ref, rtol=1e-5, atol=1e-5)
        assert close == (weight_2d == two_d)
    # The weight gradient's operands (x and dy column-wise, 32 x 1) do not depend on the weight.
    x_col = qx._storage.operand.columnwise.dequantize().double()
    dy_col = qdy._storage.operand.columnwise.dequantize().double()
    torch.testing.assert_close(dw.double(), dy_col.t() @ x_col, rtol=1e-5, atol=1e-5)
