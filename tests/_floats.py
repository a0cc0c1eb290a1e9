"""Float comparisons whose tolerance scales with the magnitude compared.

Rounding differs between CPUs (AVX2 or AVX-512 kernels, blocking, reduction order, threads), and
the error of a float32 reduction grows with what it sums, not with each result: a gradient entry
near zero carries the rounding of its tensor's large ones. So the allowance here is a fraction of
the largest |value| of the expected tensor, not a fixed absolute number tuned on one machine, nor
a per-element relative one.
"""

import torch

FLOOR = 1e-12  # lets an all-zero expectation (LoRA's A before B moves) be met by exact zeros


def assert_close_scaled(got, want, rel: float = 1e-5, msg: object = "") -> None:
    """Every |got - want| <= rel * max|want| (+ FLOOR); shapes equal; a NaN anywhere fails.

    rel = 1e-5 is ~84 float32 epsilons of the largest value: ten times what packed attention and
    MoE LoRA gradients were seen to differ by (<= 1e-6 of it, AVX-512, AVX2 and scalar kernels),
    a thousand times below what a wrong mask changes (>= 1e-2)."""
    got = torch.as_tensor(got).detach().to(torch.float64)
    want = torch.as_tensor(want).detach().to(torch.float64)
    where = f"{msg}: " if msg else ""
    assert got.shape == want.shape, f"{where}shape {tuple(got.shape)} != {tuple(want.shape)}"
    if want.numel() == 0:
        return
    scale = want.abs().max().item()
    diff = (got - want).abs().max().item()
    assert diff <= rel * scale + FLOOR, f"{where}largest difference {diff:.3g} > {rel:g} x largest |value| {scale:.3g}"
