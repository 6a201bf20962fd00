"""Part IV exercises: pairs that never turn, Position Interpolation, the NTK-aware base, YaRN."""

from __future__ import annotations

import math

import torch

from rope_tutor.exercises.framework import Case, Exercise, Mistake, register
from rope_tutor.scaling import (
    ntk_scaled_base,
    rope_parameters,
    rotations_per_window,
    yarn_mscale,
    yarn_ramp,
)

# --- The extrapolation problem: pairs that never complete a turn ------------------------------


def _incomplete_pairs(dim: int, base: float, window: int) -> int:
    return int((rotations_per_window(dim, base, window) < 1).sum())


def _wavelengths(dim: int, base: float, exponent_scale: float = 2.0) -> list[float]:
    return [2 * math.pi * base ** (exponent_scale * i / dim) for i in range(dim // 2)]


def _counts_complete_pairs(dim: int, base: float, window: int) -> int:
    return sum(wavelength <= window for wavelength in _wavelengths(dim, base))


def _counts_features(dim: int, base: float, window: int) -> int:
    return 2 * _incomplete_pairs(dim, base, window)


def _wavelength_without_two_pi(dim: int, base: float, window: int) -> int:
    return sum(base ** (2 * i / dim) > window for i in range(dim // 2))


def _exponent_without_two(dim: int, base: float, window: int) -> int:
    return sum(wavelength > window for wavelength in _wavelengths(dim, base, 1.0))


def _critical_dimension_floor(dim: int, base: float, window: int) -> int:
    x = dim / 2 * math.log(window / (2 * math.pi)) / math.log(base)
    return dim // 2 - min(max(math.floor(x), 0), dim // 2)


register(
    Exercise(
        name="incomplete_pairs",
        summary="the number of rotary pairs that never complete a turn in a window of L tokens",
        signature="(dim, base, window) -> int",
        reference=_incomplete_pairs,
        cases=(
            Case.of(128, 10000.0, 4096),
            Case.of(64, 100000.0, 8192),
            Case.of(128, 500000.0, 8192),
            Case.of(64, 10000.0, 512),
            Case.of(32, 10000.0, 100000),
            Case.of(16, 10000.0, 4),
        ),
        hint=(
            "pair i (i = 0 .. dim/2 - 1) turns at theta_i = base ** (-2i / dim) radians per token, "
            "so one full turn takes its wavelength 2 pi / theta_i tokens; count the pairs whose "
            "wavelength is longer than the window."
        ),
        mistakes=(
            Mistake(
                "you counted the pairs that DO complete a turn; the question asks for those whose "
                "wavelength 2 pi base ** (2i / dim) is longer than the window.",
                _counts_complete_pairs,
            ),
            Mistake(
                "you counted features, not pairs: each pair is two features of the head, and the "
                "answer is at most dim / 2.",
                _counts_features,
            ),
            Mistake(
                "a turn is 2 pi radians: the wavelength is 2 pi / theta_i = "
                "2 pi base ** (2i / dim), not base ** (2i / dim).",
                _wavelength_without_two_pi,
            ),
            Mistake(
                "the exponent of pair i is 2i / dim, not i / dim: pair i is the i-th of the "
                "dim / 2 pairs, so i / (dim / 2) = 2i / dim.",
                _exponent_without_two,
            ),
            Mistake(
                "with the closed form, pairs i < x = (dim / 2) log_base(window / 2 pi) complete a "
                "turn: that is ceil(x) pairs, not floor(x), so dim / 2 - ceil(x) never do.",
                _critical_dimension_floor,
            ),
        ),
        rtol=0.0,
        atol=0.0,
        chapter="extrapolation_problem",
    )
)

# --- Position Interpolation ------------------------------------------------------------------


def _linear_scaling(dim: int, base: float, factor: float) -> torch.Tensor:
    return rope_parameters(dim, base, {"rope_type": "linear", "factor": factor})[0]


def _theta(dim: int, base: float) -> torch.Tensor:
    return base ** -(torch.arange(0, dim, 2, dtype=torch.float64) / dim)


def _pi_multiplies(dim: int, base: float, factor: float) -> torch.Tensor:
    return (_theta(dim, base) * factor).float()


def _pi_scales_base(dim: int, base: float, factor: float) -> torch.Tensor:
    return _theta(dim, base * factor).float()


def _pi_ignores_factor(dim: int, base: float, factor: float) -> torch.Tensor:
    return _theta(dim, base).float()


register(
    Exercise(
        name="linear_scaling",
        summary="Position Interpolation: the RoPE frequencies when every position m is read as m/s",
        signature="(dim, base, factor) -> Tensor[dim // 2]",
        reference=_linear_scaling,
        cases=(
            Case.of(8, 10000.0, 2.0),
            Case.of(64, 10000.0, 4.0),
            Case.of(128, 500000.0, 8.0),
            Case.of(32, 10000.0, 1.0),
        ),
        hint=(
            "the angle of pair i at position m becomes (m / factor) * theta_i, so the new "
            "frequency is theta_i / factor with theta_i = base ** (-2i / dim)."
        ),
        mistakes=(
            Mistake(
                "you multiplied the frequencies by the factor: that makes every pair turn faster "
                "(extrapolates further); interpolation divides them.",
                _pi_multiplies,
            ),
            Mistake(
                "you multiplied the base by the factor: that changes each pair by a different "
                "amount (and the fastest not at all). PI divides every frequency by the factor.",
                _pi_scales_base,
            ),
            Mistake("your result does not depend on the factor.", _pi_ignores_factor),
        ),
        dtype=torch.float32,
        chapter="position_interpolation",
    )
)

# --- NTK-aware base --------------------------------------------------------------------------


def _ntk_base_times_s(base: float, factor: float, dim: int) -> float:
    return base * factor


def _ntk_exponent_inverted(base: float, factor: float, dim: int) -> float:
    return base * factor ** ((dim - 2) / dim)


def _ntk_exponent_half_dim(base: float, factor: float, dim: int) -> float:
    return base * factor ** ((dim // 2) / (dim // 2 - 2))


register(
    Exercise(
        name="ntk_base",
        summary="the NTK-aware base b': slowest pair slowed by exactly s, fastest pair untouched",
        signature="(base, factor, dim) -> float",
        reference=ntk_scaled_base,
        cases=(
            Case.of(10000.0, 4.0, 128),
            Case.of(10000.0, 2.0, 64),
            Case.of(500000.0, 8.0, 128),
            Case.of(10000.0, 16.0, 16),
            Case.of(10000.0, 1.0, 32),
        ),
        hint=(
            "the slowest pair, i = dim/2 - 1, has frequency b ** (-(dim - 2) / dim); require "
            "b' ** (-(dim - 2) / dim) = b ** (-(dim - 2) / dim) / s and solve for b'."
        ),
        mistakes=(
            Mistake(
                "you scaled the base by s itself. Then the slowest pair is slowed by "
                "s ** ((dim - 2) / dim), a little less than s: the exponent must be "
                "dim / (dim - 2).",
                _ntk_base_times_s,
            ),
            Mistake(
                "your exponent is upside down: it must be dim / (dim - 2), not (dim - 2) / dim.",
                _ntk_exponent_inverted,
            ),
            Mistake(
                "you used dim / 2 (the number of pairs) in the exponent; it is the head dim d: "
                "d / (d - 2).",
                _ntk_exponent_half_dim,
            ),
        ),
        rtol=1e-9,
        atol=0.0,
        chapter="ntk_aware",
    )
)

# --- YaRN ramp -------------------------------------------------------------------------------


def _yarn_ramp(
    dim: int,
    base: float,
    original_max_position_embeddings: int,
    beta_fast: float = 32.0,
    beta_slow: float = 1.0,
) -> torch.Tensor:
    return yarn_ramp(dim, base, original_max_position_embeddings, beta_fast, beta_slow)


def _ramp_from(low: float, high: float, dim: int) -> torch.Tensor:
    if low == high:
        high += 0.001
    return 1 - ((torch.arange(dim // 2, dtype=torch.float64) - low) / (high - low)).clamp(0, 1)


def _index_of(turns: float, dim: int, base: float, window: int) -> float:
    return dim * math.log(window / (2 * math.pi * turns)) / (2 * math.log(base))


def _ramp_betas_swapped(dim, base, window, beta_fast=32.0, beta_slow=1.0) -> torch.Tensor:
    low = max(math.floor(_index_of(beta_slow, dim, base, window)), 0)
    high = min(math.ceil(_index_of(beta_fast, dim, base, window)), dim - 1)
    return _ramp_from(low, high, dim)


def _ramp_inverted(dim, base, window, beta_fast=32.0, beta_slow=1.0) -> torch.Tensor:
    return 1 - yarn_ramp(dim, base, window, beta_fast, beta_slow)


def _ramp_not_rounded(dim, base, window, beta_fast=32.0, beta_slow=1.0) -> torch.Tensor:
    return yarn_ramp(dim, base, window, beta_fast, beta_slow, truncate=False)


def _ramp_not_clamped(dim, base, window, beta_fast=32.0, beta_slow=1.0) -> torch.Tensor:
    low = math.floor(_index_of(beta_fast, dim, base, window))
    high = math.ceil(_index_of(beta_slow, dim, base, window))
    return _ramp_from(low, high, dim)


register(
    Exercise(
        name="yarn_ramp",
        summary="YaRN's ramp gamma_i: 1 keeps a fast pair, 0 interpolates a slow pair fully",
        signature=(
            "(dim, base, original_max_position_embeddings, beta_fast=32.0, beta_slow=1.0) "
            "-> float64 Tensor[dim // 2]"
        ),
        reference=_yarn_ramp,
        cases=(
            Case.of(128, 10000.0, 4096),
            Case.of(64, 10000.0, 2048),
            Case.of(128, 500000.0, 8192),
            Case.of(128, 10000.0, 4096, beta_fast=16.0, beta_slow=2.0),
            Case.of(32, 10000.0, 512),
            # The lab's head (chapter "Extending a trained RoPE model"): i(32) < 0, so low is -1
            # before the clamp and the fastest pair would be partly interpolated without it.
            Case.of(32, 10000.0, 128),
        ),
        hint=(
            "low = floor(i(beta_fast)), high = ceil(i(beta_slow)) with "
            "i(r) = dim * ln(L / (2 pi r)) / (2 ln base), clamped to [0, dim - 1]; then "
            "gamma_i = 1 - clip((i - low) / (high - low), 0, 1)."
        ),
        mistakes=(
            Mistake(
                "you swapped beta_fast and beta_slow: low must come from beta_fast = 32 (pairs "
                "that turn many times, kept) and high from beta_slow = 1 (pairs that turn less "
                "than once, interpolated).",
                _ramp_betas_swapped,
            ),
            Mistake(
                "your ramp is upside down: gamma = 1 means 'keep the frequency' and belongs to the "
                "fast pairs (small i); slow pairs (large i) get 0.",
                _ramp_inverted,
            ),
            Mistake(
                "round the boundaries outward as the reference code does: floor for low, ceil "
                "for high (Hugging Face's truncate=True).",
                _ramp_not_rounded,
            ),
            Mistake(
                "clamp the boundaries to [0, dim - 1]: with a short window no pair turns beta_fast "
                "times, i(beta_fast) is negative (low = -1 for dim 32, L = 128) and without the "
                "clamp the fastest pair is partly interpolated instead of kept.",
                _ramp_not_clamped,
            ),
        ),
        dtype=torch.float64,  # the chapter asks for a float64 tensor
        chapter="yarn_and_beyond",
    )
)

# --- YaRN parameters -------------------------------------------------------------------------


def _yarn_parameters(
    dim: int, base: float, factor: float, original_max_position_embeddings: int
) -> tuple[torch.Tensor, float]:
    scaling = {
        "rope_type": "yarn",
        "factor": factor,
        "original_max_position_embeddings": original_max_position_embeddings,
    }
    return rope_parameters(dim, base, scaling)


def _yarn_no_temperature(dim, base, factor, window) -> tuple[torch.Tensor, float]:
    return _yarn_parameters(dim, base, factor, window)[0], 1.0


def _yarn_temperature_squared(dim, base, factor, window) -> tuple[torch.Tensor, float]:
    inv_freq, attention_factor = _yarn_parameters(dim, base, factor, window)
    return inv_freq, attention_factor**2


def _yarn_betas_swapped(dim, base, factor, window) -> tuple[torch.Tensor, float]:
    gamma = _ramp_betas_swapped(dim, base, window)
    theta = _theta(dim, base)
    return (gamma * theta + (1 - gamma) * theta / factor).float(), yarn_mscale(factor)


def _yarn_pi_only(dim, base, factor, window) -> tuple[torch.Tensor, float]:
    return (_theta(dim, base) / factor).float(), yarn_mscale(factor)


register(
    Exercise(
        name="yarn_parameters",
        summary="YaRN's frequencies and attention factor (NTK-by-parts plus the temperature)",
        signature=(
            "(dim, base, factor, original_max_position_embeddings) -> (Tensor[dim // 2], float)"
        ),
        reference=_yarn_parameters,
        cases=(
            Case.of(128, 10000.0, 16.0, 4096),
            Case.of(64, 10000.0, 4.0, 2048),
            Case.of(128, 500000.0, 8.0, 8192),
            Case.of(32, 10000.0, 1.0, 512),
        ),
        hint=(
            "theta'_i = gamma_i * theta_i + (1 - gamma_i) * theta_i / factor with YaRN's ramp "
            "gamma, and attention factor 0.1 * ln(factor) + 1 (1 when factor <= 1): it multiplies "
            "cos and sin, so the logits get its square."
        ),
        mistakes=(
            Mistake(
                "your frequencies are right but you forgot the temperature: the attention factor "
                "is 0.1 * ln(factor) + 1, not 1.",
                _yarn_no_temperature,
            ),
            Mistake(
                "you returned the factor the logits are multiplied by (its square). The attention "
                "factor multiplies cos and sin, i.e. both q and k: return 0.1 * ln(factor) + 1.",
                _yarn_temperature_squared,
            ),
            Mistake(
                "you swapped beta_fast and beta_slow in the ramp: the fast pairs (small i) must "
                "keep their frequency and the slow ones be divided by the factor.",
                _yarn_betas_swapped,
            ),
            Mistake(
                "you divided every frequency by the factor (that is PI); YaRN keeps the fast "
                "pairs.",
                _yarn_pi_only,
            ),
        ),
        dtype=torch.float32,
        chapter="yarn_and_beyond",
    )
)
