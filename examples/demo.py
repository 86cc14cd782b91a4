"""A minute with portable TransformerEngine: what was built, then te.LayerNorm/te.RMSNorm
swapped in for torch.nn's, timed forward+backward and checked against plain PyTorch."""
import time

import torch

import transformer_engine.pytorch as te


def main():
    print(te.format_build_info(te.build_info()))
    torch.manual_seed(0)
    hidden, tokens = 1024, 4096
    ours = torch.nn.Sequential(te.LayerNorm(hidden), torch.nn.GELU(), te.RMSNorm(hidden))
    plain = torch.nn.Sequential(torch.nn.LayerNorm(hidden), torch.nn.GELU(), torch.nn.RMSNorm(hidden, eps=1e-5))
    plain.load_state_dict(ours.state_dict())
    ours, plain = ours.to(torch.bfloat16), plain.to(torch.bfloat16)
    x = torch.randn(tokens, hidden, dtype=torch.bfloat16)
    for name, model in (("te", ours), ("torch", plain)):
        model(x).float().square().mean().backward()  # warm-up
        start = time.perf_counter()
        for _ in range(5):
            model(x).float().square().mean().backward()
        print(f"{name:>5}: LayerNorm -> GELU -> RMSNorm fwd+bwd on [{tokens}, {hidden}] bf16: "
              f"{(time.perf_counter() - start) / 5 * 1e3:.1f} ms/step")
    diff = (ours(x).float() - plain(x).float()).abs().max().item()
    print(f"max |te - torch| output difference: {diff:.3g} (bf16)")


if __name__ == "__main__":
    main()
