"""Seeded weights for a tiny model, and the tensors a module returned as plain float32 CPU copies: what every proof
worker shares (integrate.verify._worker for the transformer, verify/components/ for a text encoder or the VAE). Torch is
imported inside each function: the CLI imports nothing of it through here."""

from __future__ import annotations

import math


def randomize(model, seed: int) -> None:
    """Seeded weights with no zeros (zero-initialised output layers would make every output agree)."""
    import torch

    g = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for name, p in model.named_parameters():
            if p.numel() == 0:
                continue
            if p.ndim >= 2:
                p.copy_(torch.randn(p.shape, generator=g) / math.sqrt(max(1, p[0].numel())))
            elif name.endswith("bias"):
                p.copy_(0.02 * torch.randn(p.shape, generator=g))
            else:  # norm scales and learned vectors
                p.copy_(1.0 + 0.1 * torch.randn(p.shape, generator=g))


def plain(t):
    """A float32 CPU copy (an async collective's result waited for, a DTensor's full tensor)."""
    import torch

    wait = getattr(t, "trigger_wait", None)
    if wait is not None:
        t = wait()
    if hasattr(t, "full_tensor"):
        t = t.full_tensor()
    return torch.Tensor(t).detach().to(torch.float32).cpu() if type(t) is not torch.Tensor else \
        t.detach().to(torch.float32).cpu()


def tensors(value) -> list:
    """The tensors in a module's output, in order (tuples, lists, dicts and model outputs, a decoder's `.sample`)."""
    import torch

    if isinstance(value, torch.Tensor):
        return [value]
    if isinstance(value, (tuple, list)):
        return [t for v in value for t in tensors(v)]
    if isinstance(value, dict):
        return [t for v in value.values() for t in tensors(v)]
    if hasattr(value, "sample") and isinstance(value.sample, torch.Tensor):
        return [value.sample]
    return []
