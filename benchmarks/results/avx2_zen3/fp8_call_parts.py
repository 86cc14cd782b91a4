"""The parts of an FP8 te.Linear forward without a backward (decoding) that are the module's own
Python, each timed alone in a loop: the forward's record for a recompute (_record_fp8_forward,
its scales' copies scales_to_replay) and the GEMM's quantizers. `python fp8_call_parts.py`."""
import timeit, torch
import transformer_engine.pytorch as te
from transformer_engine.common import recipe
from transformer_engine.pytorch.module._fp8_call import gemm_quantizers, ONE_GEMM
from transformer_engine.pytorch.fp8.replay import scales_to_replay
rec = recipe.DelayedScaling()
with te.quantized_model_init(enabled=True, recipe=rec):
    lin = te.Linear(128, 128, bias=False, params_dtype=torch.bfloat16)
x = torch.randn(1, 128, dtype=torch.bfloat16)
with torch.no_grad(), te.autocast(recipe=rec):
    lin(x)
meta = lin._meta_for(rec, x.device)
def t(f, n=20000):
    f(); return min(timeit.repeat(f, number=n, repeat=9)) / n * 1e6
with te.autocast(recipe=rec):
    r = [t(lambda: lin._record_fp8_forward(meta)), t(lambda: scales_to_replay(meta)),
         t(lambda: gemm_quantizers(rec, meta, False, ONE_GEMM[0]))]
print("record_fp8_forward %.2f  scales_to_replay %.2f  gemm_quantizers(no backward) %.2f us" % tuple(r))
