"""Part IV: context-extension methods for RoPE, one small function each behind one registry.

The registry speaks Hugging Face's ``rope_scaling`` vocabulary: ``scaling["rope_type"]`` picks the
method. Chapters "The extrapolation problem" to "Beyond: NTK-by-parts and YaRN".

Like Hugging Face's ``modeling_rope_utils``, this registry knows nothing of the model code: it
imports Part I's frequencies (``sinusoidal_frequencies``, theta_i = b^(-2i/d)) and Part II
(``rope``) imports it, never the reverse.

Every method returns ``(inv_freq, attention_factor)``. Frequencies are computed in float64 and
returned as float32; cos and sin are multiplied by ``attention_factor`` by the caller.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Mapping
from typing import Any

import torch

from rope_tutor import _checks
from rope_tutor.absolute import sinusoidal_frequencies

__all__ = [
    "SCALINGS",
    "effective_scale_factors",
    "ntk_scaled_base",
    "rope_parameters",
    "rotations_per_window",
    "yarn_correction_range",
    "yarn_mscale",
    "yarn_ramp",
]

ScalingFunction = Callable[[int, float, Mapping[str, Any], int | None], tuple[torch.Tensor, float]]

#: Keys every method accepts: the method's name (``"type"`` is Hugging Face's older spelling) and
#: ``"rope_theta"``, which Hugging Face v5 keeps in the same dict (it must then equal ``base``).
_COMMON_KEYS = frozenset({"rope_type", "type", "rope_theta"})

#: Keys each method reads, besides the common ones. Any other key is an error (a typo such as
#: ``"beta_fats"`` would otherwise be ignored silently).
_METHOD_KEYS: dict[str, frozenset[str]] = {
    "default": frozenset(),
    "linear": frozenset({"factor"}),
    "ntk": frozenset({"factor"}),
    "dynamic": frozenset({"factor", "original_max_position_embeddings"}),
    "yarn": frozenset(
        {
            "factor",
            "original_max_position_embeddings",
            "beta_fast",
            "beta_slow",
            "attention_factor",
            "mscale",
            "mscale_all_dim",
            "truncate",
        }
    ),
    "llama3": frozenset(
        {"factor", "original_max_position_embeddings", "low_freq_factor", "high_freq_factor"}
    ),
    "longrope": frozenset(
        {
            "factor",
            "original_max_position_embeddings",
            "short_factor",
            "long_factor",
            "attention_factor",
        }
    ),
}


# ---------------------------------------------------------------------------------------------
# Reading and checking the settings
# ---------------------------------------------------------------------------------------------


def _number(scaling: Mapping[str, Any], key: str, default: float | None = None) -> float:
    """``scaling[key]`` as a finite float (``default`` if absent); ``ValueError`` names the key."""
    if key not in scaling:
        if default is None:
            kind = scaling.get("rope_type", scaling.get("type"))
            raise ValueError(f"rope_type {kind!r} needs the key {key!r}, which is missing")
        return default
    return _checks.real(key, scaling[key])


def _factor(scaling: Mapping[str, Any]) -> float:
    factor = _number(scaling, "factor")
    if factor < 1:
        raise ValueError(f"factor must be >= 1 (it stretches the context), got factor={factor!r}")
    return factor


def _window(scaling: Mapping[str, Any]) -> int:
    key = "original_max_position_embeddings"
    if key not in scaling:
        _number(scaling, key)  # the missing-key message
    return _checks.integer(key, scaling[key], minimum=2)


def _check_ntk_dim(dim: int) -> int:
    """NTK-aware bases use the exponent dim / (dim - 2): dim must be even and at least 4."""
    return _checks.integer("dim", dim, minimum=4, even=True)


# ---------------------------------------------------------------------------------------------
# Public helpers (each is an equation of Part IV)
# ---------------------------------------------------------------------------------------------


def rotations_per_window(dim: int, base: float, window: int) -> torch.Tensor:
    """Number of full turns r_i = window * theta_i / (2 pi) each pair makes over ``window`` tokens.

    Equation (rotations-per-window) in "The extrapolation problem"; the quantity r(d) of Peng et
    al., YaRN (2023), section 3.2. A pair with r_i >= 1 has seen every angle during training.
    Returns float64 of shape ``(dim // 2,)``.
    """
    window = _checks.integer("window", window)
    return window * sinusoidal_frequencies(dim, base) / (2 * math.pi)


def ntk_scaled_base(base: float, factor: float, dim: int) -> float:
    """NTK-aware base b' = b * s ** (dim / (dim - 2)).

    Equation (ntk-base) in "NTK-aware scaling"; bloc97 (2023), derived in Peng et al., YaRN
    (2023), appendix A.1: the slowest pair is interpolated by exactly s, the fastest is untouched.
    Raises ``ValueError`` for ``dim < 4`` or ``factor < 1``.
    """
    dim = _check_ntk_dim(dim)
    base = _checks.base(base)
    factor = _factor({"factor": factor})
    return base * factor ** (dim / (dim - 2))


def yarn_mscale(factor: float, mscale: float = 1.0) -> float:
    """YaRN's attention factor sqrt(1/t) = 0.1 * mscale * ln(s) + 1 (1 when s <= 1).

    Equation (yarn-mscale) in "Beyond: NTK-by-parts and YaRN"; Peng et al., YaRN (2023), eq. 22
    (``mscale`` = 1 there; DeepSeek-V2/V3 configs set other values). Cos and sin are both
    multiplied by it, so the attention logits are multiplied by its square.
    """
    factor, mscale = _checks.real("factor", factor), _checks.real("mscale", mscale)
    return 1.0 if factor <= 1 else 0.1 * mscale * math.log(factor) + 1.0


def yarn_correction_range(
    dim: int,
    base: float,
    original_max_position_embeddings: int,
    beta_fast: float = 32.0,
    beta_slow: float = 1.0,
    truncate: bool = True,
) -> tuple[float, float]:
    """Pair indices (low, high) where YaRN's ramp starts and ends.

    The pair making r turns over the trained window sits at index
    i(r) = dim * ln(L / (2 pi r)) / (2 ln base), equation (yarn-correction-dim) in "Beyond:
    NTK-by-parts and YaRN". ``low = i(beta_fast)``, ``high = i(beta_slow)``, rounded outward
    (floor, ceil) when ``truncate`` and clamped to [0, dim - 1] as in the reference code of Peng
    et al., YaRN (2023) and Hugging Face. Raises ``ValueError`` if ``beta_fast < beta_slow``
    (the ramp would run backwards: fast pairs interpolated, slow pairs untouched) or if a beta is
    not positive.
    """
    dim, base = _checks.even_dim("dim", dim), _checks.base(base)
    window = _checks.integer(
        "original_max_position_embeddings", original_max_position_embeddings, minimum=2
    )
    beta_fast, beta_slow = (
        _checks.real("beta_fast", beta_fast),
        _checks.real("beta_slow", beta_slow),
    )
    truncate = _checks.flag("truncate", truncate)
    if not beta_slow > 0:
        raise ValueError(f"beta_slow must be > 0 (a number of turns), got beta_slow={beta_slow!r}")
    if beta_fast < beta_slow:
        raise ValueError(
            f"beta_fast must be >= beta_slow (fast pairs turn more often), got "
            f"beta_fast={beta_fast!r} and beta_slow={beta_slow!r}; did you swap them?"
        )

    def index_of(turns: float) -> float:
        return dim * math.log(window / (2 * math.pi * turns)) / (2 * math.log(base))

    low, high = index_of(beta_fast), index_of(beta_slow)
    if truncate:
        low, high = math.floor(low), math.ceil(high)
    return max(low, 0), min(high, dim - 1)


def yarn_ramp(
    dim: int,
    base: float,
    original_max_position_embeddings: int,
    beta_fast: float = 32.0,
    beta_slow: float = 1.0,
    truncate: bool = True,
) -> torch.Tensor:
    """YaRN's ramp gamma_i: 1 keeps pair i's frequency, 0 interpolates it fully (divides it by s).

    gamma_i = 1 - clip((i - low) / (high - low), 0, 1) with (low, high) from
    ``yarn_correction_range``; equation (yarn-ramp) in "Beyond: NTK-by-parts and YaRN"; Peng et
    al., YaRN (2023), eq. 17-18 as implemented in their code (linear in the pair index). Pairs
    that turn more than ``beta_fast`` times in the window get 1, fewer than ``beta_slow`` get 0.
    Returns float64 of shape ``(dim // 2,)``.
    """
    low, high = yarn_correction_range(
        dim, base, original_max_position_embeddings, beta_fast, beta_slow, truncate
    )
    if low == high:
        high += 0.001  # a step instead of a ramp; avoids dividing by zero (as the reference code)
    index = torch.arange(dim // 2, dtype=torch.float64)
    return 1 - ((index - low) / (high - low)).clamp(0, 1)


def effective_scale_factors(
    dim: int,
    base: float = 10000.0,
    scaling: Mapping[str, Any] | None = None,
    *,
    seq_len: int | None = None,
) -> torch.Tensor:
    """How much each pair is slowed down: s_i = theta_i / theta'_i (1 = untouched, s = PI).

    Equation (effective-scale) in "NTK-aware scaling". Same arguments as ``rope_parameters``.
    Returns float64 of shape ``(dim // 2,)``.
    """
    inv_freq, _ = rope_parameters(dim, base, scaling, seq_len=seq_len)
    theta = sinusoidal_frequencies(dim, base).float()  # rounded to float32, as inv_freq is
    return theta.double() / inv_freq.double()


# ---------------------------------------------------------------------------------------------
# The methods: same signature, one registry
# ---------------------------------------------------------------------------------------------


def _default(
    dim: int, base: float, scaling: Mapping[str, Any], seq_len: int | None
) -> tuple[torch.Tensor, float]:
    """Unscaled RoPE: theta_i = base ** (-2i/dim), attention factor 1 (Su et al., 2021)."""
    return sinusoidal_frequencies(dim, base).float(), 1.0


def _linear(
    dim: int, base: float, scaling: Mapping[str, Any], seq_len: int | None
) -> tuple[torch.Tensor, float]:
    """Position Interpolation: theta'_i = theta_i / s, i.e. position m read as m / s.

    Equations (pi-positions) and (pi-theta) in "Position Interpolation"; Chen et al. (2023), eq. 4.
    """
    theta = sinusoidal_frequencies(dim, base) / _factor(scaling)
    return theta.float(), 1.0


def _ntk(
    dim: int, base: float, scaling: Mapping[str, Any], seq_len: int | None
) -> tuple[torch.Tensor, float]:
    """Static NTK-aware scaling: RoPE with base b * s ** (dim / (dim - 2)).

    Equation (ntk-base) in "NTK-aware scaling"; bloc97 (2023). Not in Hugging Face (its
    ``"dynamic"`` type is the dynamic variant).
    """
    return sinusoidal_frequencies(dim, ntk_scaled_base(base, _factor(scaling), dim)).float(), 1.0


def _dynamic(
    dim: int, base: float, scaling: Mapping[str, Any], seq_len: int | None
) -> tuple[torch.Tensor, float]:
    """Dynamic NTK: base b * (s * l / L - (s - 1)) ** (dim / (dim - 2)) with l = max(seq_len, L).

    Equation (dynamic-ntk-base) in "NTK-aware scaling"; emozilla (2023), as in Hugging Face's
    ``"dynamic"`` type. L is ``original_max_position_embeddings``; up to L it is plain RoPE.
    """
    _check_ntk_dim(dim)
    factor, window = _factor(scaling), _window(scaling)
    length = window if seq_len is None else max(int(seq_len), window)
    new_base = base * (factor * length / window - (factor - 1)) ** (dim / (dim - 2))
    return sinusoidal_frequencies(dim, new_base).float(), 1.0


def _yarn(
    dim: int, base: float, scaling: Mapping[str, Any], seq_len: int | None
) -> tuple[torch.Tensor, float]:
    """YaRN: NTK-by-parts frequencies and the attention temperature.

    theta'_i = gamma_i * theta_i + (1 - gamma_i) * theta_i / s, equation (yarn-theta), with the
    ramp (yarn-ramp); attention factor (yarn-mscale), or ``attention_factor`` when given, or
    ``yarn_mscale(s, mscale) / yarn_mscale(s, mscale_all_dim)`` when both of those are given
    and non-zero (DeepSeek-V2/V3; as Hugging Face, a zero or a lone one is ignored). Peng et al.,
    YaRN (2023); "Beyond: NTK-by-parts and YaRN".
    """
    factor, window = _factor(scaling), _window(scaling)
    truncate = _checks.flag("truncate", scaling.get("truncate", True))
    gamma = yarn_ramp(
        dim,
        base,
        window,
        _number(scaling, "beta_fast", 32.0),
        _number(scaling, "beta_slow", 1.0),
        truncate,
    )
    theta = sinusoidal_frequencies(dim, base)
    inv_freq = gamma * theta + (1 - gamma) * theta / factor

    if "attention_factor" in scaling:
        attention_factor = _number(scaling, "attention_factor")
        if attention_factor <= 0:
            raise ValueError(f"attention_factor must be > 0, got {attention_factor=}")
    else:
        mscale = _number(scaling, "mscale", 0.0)
        mscale_all_dim = _number(scaling, "mscale_all_dim", 0.0)
        if mscale and mscale_all_dim:
            attention_factor = yarn_mscale(factor, mscale) / yarn_mscale(factor, mscale_all_dim)
        else:
            attention_factor = yarn_mscale(factor)
    return inv_freq.float(), attention_factor


def _llama3(
    dim: int, base: float, scaling: Mapping[str, Any], seq_len: int | None
) -> tuple[torch.Tensor, float]:
    """Llama 3.1 band scaling: keep short wavelengths, divide long ones by s, blend in between.

    Equation (llama3-theta) in "Beyond: NTK-by-parts and YaRN"; Dubey et al., The Llama 3 Herd
    of Models (2024), as in Meta's ``apply_scaling`` and Hugging Face's ``"llama3"`` type. The
    blend weight is linear in L / lambda_i, the number of turns over the original window L.
    """
    factor, window = _factor(scaling), _window(scaling)
    low = _number(scaling, "low_freq_factor")
    high = _number(scaling, "high_freq_factor")
    if not 0 < low < high:
        raise ValueError(
            "need 0 < low_freq_factor < high_freq_factor, got "
            f"low_freq_factor={low!r} and high_freq_factor={high!r}"
        )
    theta = sinusoidal_frequencies(dim, base)
    turns = window * theta / (2 * math.pi)  # L / wavelength
    keep = ((turns - low) / (high - low)).clamp(0, 1)  # 1: untouched, 0: divided by s
    inv_freq = keep * theta + (1 - keep) * theta / factor
    return inv_freq.float(), 1.0


def _longrope(
    dim: int, base: float, scaling: Mapping[str, Any], seq_len: int | None
) -> tuple[torch.Tensor, float]:
    """LongRoPE: one searched factor per pair, theta'_i = theta_i / lambda_i.

    Equations (longrope-theta) and (longrope-attention-factor) in "Beyond: NTK-by-parts and
    YaRN"; Ding et al., LongRoPE (2024), as in Hugging Face's ``"longrope"`` type (Phi-3).
    ``long_factor`` is used when ``seq_len`` exceeds ``original_max_position_embeddings``,
    ``short_factor`` otherwise. The attention factor is sqrt(1 + ln s / ln L) unless
    ``attention_factor`` is given (then ``factor`` may be omitted).
    """
    window = _window(scaling)
    use_long = seq_len is not None and seq_len > window
    key = "long_factor" if use_long else "short_factor"
    for name in ("short_factor", "long_factor"):
        values = scaling.get(name)
        if not isinstance(values, list | tuple) or len(values) != dim // 2:
            raise ValueError(
                f"{name} must be a list of dim // 2 = {dim // 2} numbers, got {name}={values!r}"
            )
        for value in values:
            _number({name: value}, name)
            if value <= 0:
                raise ValueError(f"{name} entries must be > 0, got {name} containing {value!r}")
    ext = torch.tensor(scaling[key], dtype=torch.float64)
    inv_freq = sinusoidal_frequencies(dim, base) / ext

    if "attention_factor" in scaling:
        attention_factor = _number(scaling, "attention_factor")
        if attention_factor <= 0:
            raise ValueError(f"attention_factor must be > 0, got {attention_factor=}")
    else:
        factor = _factor(scaling)
        attention_factor = math.sqrt(1 + math.log(factor) / math.log(window))  # 1 when s = 1
    return inv_freq.float(), attention_factor


#: rope_type -> method. Adding a method is adding one function and one line here (and its keys
#: in ``_METHOD_KEYS``).
SCALINGS: dict[str, ScalingFunction] = {
    "default": _default,
    "linear": _linear,
    "ntk": _ntk,
    "dynamic": _dynamic,
    "yarn": _yarn,
    "llama3": _llama3,
    "longrope": _longrope,
}


def rope_parameters(
    dim: int,
    base: float = 10000.0,
    scaling: Mapping[str, Any] | None = None,
    *,
    seq_len: int | None = None,
) -> tuple[torch.Tensor, float]:
    """Frequencies and attention factor of RoPE under a context-extension method.

    Returns ``(inv_freq, attention_factor)``: ``inv_freq`` is float32 of shape ``(dim // 2,)``
    (computed in float64); cos and sin are multiplied by ``attention_factor`` (so attention logits
    scale by its square). ``scaling`` is a Hugging Face style ``rope_scaling`` dict; ``None`` means
    no scaling. ``seq_len`` is the current sequence length, read by ``"dynamic"`` and
    ``"longrope"`` only. Raises ``ValueError`` naming the key and value for an unknown
    ``rope_type``, a missing or unknown key, a non-numeric value, ``factor < 1``,
    ``low_freq_factor >= high_freq_factor``, ``beta_fast < beta_slow`` or a factor list whose
    length is not ``dim // 2``.
    """
    dim, base = _checks.even_dim("dim", dim), _checks.base(base)
    scaling = dict(scaling or {})
    kind = scaling.get("rope_type", scaling.get("type", "default"))
    if kind not in SCALINGS:
        raise ValueError(f"unknown rope_type {kind!r}; expected one of {sorted(SCALINGS)}")
    unknown = sorted(set(scaling) - _COMMON_KEYS - _METHOD_KEYS[kind])
    if unknown:
        raise ValueError(
            f"rope_type {kind!r} does not use the key(s) {unknown} "
            f"(got {', '.join(f'{k}={scaling[k]!r}' for k in unknown)}); "
            f"it reads {sorted(_METHOD_KEYS[kind])}"
        )
    if "rope_theta" in scaling and scaling["rope_theta"] != base:
        raise ValueError(
            f"rope_theta={scaling['rope_theta']!r} in the scaling dict disagrees with base={base!r}"
        )
    if seq_len is not None:
        seq_len = _checks.integer("seq_len", seq_len)
    scaling["rope_type"] = kind
    return SCALINGS[kind](dim, base, scaling, seq_len)
