"""The model and data the client-framework tests (accelerate, Lightning) train: the layers those
frameworks convert to TE (Linear, LayerNorm), sized for FP8 (dimensions multiples of 16)."""
import torch


def small_mlp() -> torch.nn.Module:
    torch.manual_seed(0)
    return torch.nn.Sequential(torch.nn.Linear(32, 64), torch.nn.LayerNorm(64), torch.nn.GELU(),
                               torch.nn.Linear(64, 16))


def regression_batch():
    """(x [64, 32], y [64, 16]), the same on every call."""
    generator = torch.Generator().manual_seed(1)
    return torch.randn(64, 32, generator=generator), torch.randn(64, 16, generator=generator)


def regression_losses(model: torch.nn.Module, optimizer, backward, steps: int) -> list:
    """The losses of `steps` SGD-style steps on regression_batch(); backward(loss) is the
    framework's (accelerator.backward, fabric.backward)."""
    x, y = regression_batch()
    losses = []
    for _ in range(steps):
        loss = torch.nn.functional.mse_loss(model(x).float(), y)
        backward(loss)
        optimizer.step()
        optimizer.zero_grad()
        losses.append(loss.item())
    return losses
