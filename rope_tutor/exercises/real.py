"""Chapter "A real model past its window": the base transformers' dynamic NTK type uses.

Hugging Face's ``"dynamic"`` rope type (``_compute_dynamic_ntk_parameters`` in transformers'
``modeling_rope_utils.py``) takes the original window L from ``max_position_embeddings`` and reads
``factor`` as a slope: at length l it uses the NTK-aware base b * (s * l' / L - (s - 1)) ** (d /
(d - 2)) with l' = max(l, L), so factor 1 gives the scale l / L of emozilla's rule (equation
(dynamic-ntk-base) in "NTK-aware scaling") and factor s > 1 a larger one.
"""

from __future__ import annotations

from rope_tutor.exercises.framework import Case, Exercise, Mistake, register


def _hf_dynamic_base(base: float, dim: int, length: int, window: int, factor: float) -> float:
    scale = factor * max(length, window) / window - (factor - 1)
    return base * scale ** (dim / (dim - 2))


def _factor_is_the_scale(base: float, dim: int, length: int, window: int, factor: float) -> float:
    return base * factor ** (dim / (dim - 2))


def _scale_is_length_ratio(base: float, dim: int, length: int, window: int, factor: float) -> float:
    return base * (max(length, window) / window) ** (dim / (dim - 2))


def _factor_times_ratio(base: float, dim: int, length: int, window: int, factor: float) -> float:
    return base * (factor * max(length, window) / window) ** (dim / (dim - 2))


def _no_floor_at_window(base: float, dim: int, length: int, window: int, factor: float) -> float:
    return base * (factor * length / window - (factor - 1)) ** (dim / (dim - 2))


def _no_ntk_exponent(base: float, dim: int, length: int, window: int, factor: float) -> float:
    return base * (factor * max(length, window) / window - (factor - 1))


register(
    Exercise(
        name="hf_dynamic_base",
        summary="the base transformers' 'dynamic' rope type uses at length l (factor is a slope)",
        signature="(base, dim, length, window, factor) -> float",
        reference=_hf_dynamic_base,
        cases=(
            Case.of(100000.0, 64, 16384, 8192, 1.0),
            Case.of(100000.0, 64, 24576, 8192, 2.0),
            Case.of(100000.0, 64, 4096, 8192, 2.0),
            Case.of(10000.0, 128, 32768, 4096, 4.0),
            Case.of(500000.0, 128, 12288, 8192, 1.5),
        ),
        hint=(
            "the scale at length l is factor * max(l, L) / L - (factor - 1) (1 at l = L, growing "
            "with slope factor / L), and the base is the NTK-aware one for that scale: "
            "base * scale ** (dim / (dim - 2))."
        ),
        mistakes=(
            Mistake(
                "your base does not change with the length: that is static NTK with s = factor. "
                "The dynamic type recomputes the scale from the length.",
                _factor_is_the_scale,
            ),
            Mistake(
                "you used the scale l / L whatever the factor (emozilla's rule). transformers' "
                "factor is a slope: the scale is factor * l / L - (factor - 1), which is l / L "
                "only for factor 1.",
                _scale_is_length_ratio,
            ),
            Mistake(
                "you multiplied l / L by the factor: at l = L that already scales by the factor. "
                "transformers subtracts factor - 1, so the scale is exactly 1 at the window.",
                _factor_times_ratio,
            ),
            Mistake(
                "below the window your scale drops under 1 (a base smaller than the model's). "
                "transformers uses max(l, L): the dynamic type is plain RoPE up to L.",
                _no_floor_at_window,
            ),
            Mistake(
                "you scaled the base by the scale itself; the NTK-aware base needs the exponent "
                "dim / (dim - 2) so that the slowest pair is slowed by exactly the scale.",
                _no_ntk_exponent,
            ),
        ),
        rtol=1e-9,
        atol=0.0,
        chapter="real_model",
    )
)
