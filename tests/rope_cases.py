"""Inputs and the agreement bound shared by the tests of RoPE's fast paths: the blocked CPU path
(test_fast.py) and the Triton kernel (test_triton_rope.py and the cases it runs in Triton's
interpreter, triton_interpreter_cases.py). One copy, so that every fast path is held to the same
settings and the same bound."""

from __future__ import annotations

import torch

import rope_tutor as rt

#: One setting per context-extension method of Part IV, for a rotated size of 16 (8 pairs).
SCALINGS = {
    "none": None,
    "default": {"rope_type": "default"},
    "linear": {"rope_type": "linear", "factor": 4.0},
    "ntk": {"rope_type": "ntk", "factor": 4.0},
    "dynamic": {"rope_type": "dynamic", "factor": 4.0, "original_max_position_embeddings": 32},
    "yarn": {"rope_type": "yarn", "factor": 8.0, "original_max_position_embeddings": 32},
    "llama3": {
        "rope_type": "llama3",
        "factor": 8.0,
        "low_freq_factor": 1.0,
        "high_freq_factor": 4.0,
        "original_max_position_embeddings": 32,
    },
    "longrope": {
        "rope_type": "longrope",
        "factor": 4.0,
        "original_max_position_embeddings": 32,
        "short_factor": [1.0 + 0.1 * i for i in range(8)],
        "long_factor": [1.0 + 0.5 * i for i in range(8)],
    },
}
assert {s["rope_type"] for s in SCALINGS.values() if s} == set(rt.SCALINGS)  # every method


def gaussian(*shape: int, seed: int = 0, dtype: torch.dtype = torch.float32) -> torch.Tensor:
    generator = torch.Generator().manual_seed(seed)
    return torch.randn(*shape, generator=generator, dtype=torch.float64).to(dtype)


def assert_agree(fast: torch.Tensor, reference: torch.Tensor, x: torch.Tensor) -> None:
    """Equal up to 8 units in the last place of the compute dtype, then one rounding to x's."""
    assert fast.shape == reference.shape == x.shape
    assert fast.dtype == reference.dtype == x.dtype
    compute = torch.float64 if x.dtype == torch.float64 else torch.float32
    scale = 2 * x.double().abs().amax(dim=-1, keepdim=True)  # >= |pair| * attention factor
    bound = 8 * torch.finfo(compute).eps * scale
    if x.dtype in (torch.bfloat16, torch.float16):
        bound = bound + torch.finfo(x.dtype).eps * reference.double().abs()  # one unit apart
    gap = (fast.double() - reference.double()).abs()
    assert (gap <= bound).all(), float((gap - bound).max())
