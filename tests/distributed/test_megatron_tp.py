"""Megatron-Core 0.19's GPTModel with get_gpt_layer_with_transformer_engine_spec() at
tensor_model_parallel_size=2 with sequence parallelism, on 2 gloo ranks, trains as at size 1
from the same weights, in fp32 and under FP8 (hybrid delayed scaling). The ranks'
work: megatron_tp_ranks.py."""
import pytest

pytest.importorskip("megatron.core")

from gloo_ranks import run_on_ranks  # noqa: E402
import megatron_tp_ranks  # noqa: E402

pytestmark = pytest.mark.filterwarnings("ignore::DeprecationWarning", "ignore::UserWarning")
# Largest per-step loss difference allowed (the loss is about 4.9). fp32: the same arithmetic up
# to the order in which the row-parallel GEMMs' halves are summed; FP8: the same casts (the
# scales agree over the ranks and with one rank's), the same order caveat. Measured: 4.8e-7, 0.
TOLERANCE = {"fp32": 1e-5, "fp8": 1e-4}


@pytest.mark.parametrize("precision", ["fp32", "fp8"])
def test_gpt_at_tensor_parallel_size_2_trains_as_at_size_1(precision):
    results = run_on_ranks(getattr(megatron_tp_ranks, precision), world=2)
    for rank, found in results.items():
        assert found["te_layers"] >= 8, found  # the TE spec's modules, split over the two ranks
        assert found["tp1"][-1] < found["tp1"][0]  # it learns
        worst = max(abs(a - b) for a, b in zip(found["tp1"], found["tp2"]))
        assert worst < TOLERANCE[precision], (rank, found)
    assert results[0]["tp2"] == results[1]["tp2"]  # the loss is the whole batch's on both ranks
