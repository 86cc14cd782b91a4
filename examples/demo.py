"""A minute with portable TransformerEngine: what was built, then te.LayerNorm / te.RMSNorm in
place of torch.nn's, checked against them and timed forward + backward."""
import statistics
import time

import torch

import transformer_engine.pytorch as te
from transformer_engine.bench.harness import configure_allocator


def step_ms(module, x, dy, rounds=10):
    """Median milliseconds of one forward + backward (input and parameter gradients)."""
    params = tuple(module.parameters())
    times = []
    for _ in range(rounds + 2):
        start = time.perf_counter()
        torch.autograd.grad(module(x), (x, *params), dy)
        times.append(time.perf_counter() - start)
    return 1e3 * statistics.median(times[2:])


def main():
    allocator = configure_allocator()  # keep freed tensors mapped (see README)
    print(te.format_build_info(te.build_info()))
    print(f"  allocator: {allocator}")
    torch.manual_seed(0)
    tokens, hidden = 8192, 4096
    x = torch.randn(tokens, hidden, dtype=torch.bfloat16, requires_grad=True)
    dy = torch.randn_like(x)
    pairs = {
        "LayerNorm": (te.LayerNorm(hidden, params_dtype=torch.bfloat16),
                      torch.nn.LayerNorm(hidden, dtype=torch.bfloat16)),
        "RMSNorm": (te.RMSNorm(hidden, params_dtype=torch.bfloat16),
                    torch.nn.RMSNorm(hidden, eps=1e-5, dtype=torch.bfloat16)),
    }
    for name, (ours, theirs) in pairs.items():
        with torch.no_grad():
            ours.weight.normal_(1.0, 0.1)
        theirs.load_state_dict(ours.state_dict())  # TE's parameter names load into torch.nn's
        diff = (ours(x).float() - theirs(x).float()).abs().max().item()
        ours_ms, theirs_ms = step_ms(ours, x, dy), step_ms(theirs, x, dy)
        print(f"{name:>9} fwd+bwd [{tokens}, {hidden}] bf16: te {ours_ms:6.1f} ms, torch.nn {theirs_ms:6.1f} ms "
              f"({theirs_ms / ours_ms:.2f}x); max |te - torch.nn| = {diff:.3g}")


if __name__ == "__main__":
    main()
