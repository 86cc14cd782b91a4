"""Expert parallelism on 2 gloo ranks: an all-to-all token dispatch built from te.moe_permute,
te.moe_sort_chunks_by_index, te.GroupedLinear and te.moe_unpermute equals the same experts on one
rank; Megatron-Core's MoE GPT with the TE spec at expert_model_parallel_size=2 trains as at 1.
The ranks' work: expert_parallel_ranks.py."""
import pytest

from gloo_ranks import run_on_ranks
import expert_parallel_ranks


def test_alltoall_dispatch_equals_one_rank():
    for rank, found in run_on_ranks(expert_parallel_ranks.alltoall_dispatch, world=2).items():
        scale = found.pop("scale")
        for what, diff in found.items():
            assert diff <= 1e-5 * max(scale, 1.0), (rank, what, diff)


@pytest.mark.filterwarnings("ignore::DeprecationWarning", "ignore::UserWarning")
def test_megatron_moe_at_expert_parallel_size_2():
    pytest.importorskip("megatron.core")
    for rank, found in run_on_ranks(expert_parallel_ranks.megatron_moe, world=2).items():
        assert found["expert_params"] == 8  # fc1 / fc2 weight and bias of this rank's 2 experts
        assert abs(found["loss1"] - found["loss2"]) < 1e-5, (rank, found)
        assert found["worst_grad"] < 1e-5, (rank, found)
