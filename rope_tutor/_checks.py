"""Argument checks shared by every module of the package: one place, one behaviour.

Every check raises ``ValueError`` whose message names the argument and the value it got
(``dim must be a positive even int, got dim=7``), whatever the mistake: a wrong value, a wrong
type (``dim=8.0``), a bool where a number belongs (``True`` is an ``int`` in Python, never a
size here), ``nan`` or ``inf``. Python and NumPy integers are both accepted as integers, and
Python and NumPy floats and integers as real numbers. Internal: no chapter imports this module.
"""

from __future__ import annotations

import math
import numbers
import operator
from collections.abc import Sequence
from typing import Any

import numpy as np
import torch


def integer(name: str, value: Any, *, minimum: int = 1, even: bool = False) -> int:
    """``value`` as a Python int if it is an integer >= ``minimum`` (and even when ``even``).

    Python and NumPy integers pass; bool, floats (even ``8.0``) and anything else raise.
    """
    if minimum == 1:
        kind = "a positive even int" if even else "a positive int"
    else:
        kind = f"an even int >= {minimum}" if even else f"an int >= {minimum}"
    if isinstance(value, bool) or isinstance(value, torch.Tensor):
        raise ValueError(f"{name} must be {kind}, got {name}={value!r}")
    try:
        number = operator.index(value)
    except TypeError:
        raise ValueError(f"{name} must be {kind}, got {name}={value!r}") from None
    if number < minimum or (even and number % 2):
        raise ValueError(f"{name} must be {kind}, got {name}={value!r}")
    return number


def even_dim(name: str, value: Any) -> int:
    """A head or encoding size: a positive even int, since features come in (cos, sin) pairs."""
    return integer(name, value, even=True)


def real(name: str, value: Any, *, finite: bool = True) -> float:
    """``value`` as a float if it is a real number (not bool), finite unless ``finite=False``."""
    if isinstance(value, bool) or not isinstance(value, numbers.Real):
        raise ValueError(f"{name} must be a real number, got {name}={value!r}")
    number = float(value)
    if math.isnan(number) or (finite and math.isinf(number)):
        raise ValueError(f"{name} must be a finite real number, got {name}={value!r}")
    return number


def base(value: Any, name: str = "base") -> float:
    """RoPE's or the sinusoids' base b: a finite real number greater than 1 (theta_i = b^(-2i/d)).

    b <= 1 gives frequencies that do not decrease (b = 1: every pair turns at the same rate),
    ``inf`` gives theta_i = 0 for every pair but the first, ``nan`` gives nan angles.
    """
    if isinstance(value, bool) or not isinstance(value, numbers.Real):
        raise ValueError(f"{name} must be a finite number greater than 1, got {name}={value!r}")
    number = float(value)
    if not (math.isfinite(number) and number > 1):
        raise ValueError(f"{name} must be a finite number greater than 1, got {name}={value!r}")
    return number


def choice(name: str, value: Any, options: Sequence[str]) -> str:
    """``value`` if it is one of ``options``."""
    if not isinstance(value, str) or value not in options:
        raise ValueError(f"{name} must be one of {tuple(options)}, got {name}={value!r}")
    return value


def flag(name: str, value: Any) -> bool:
    """``value`` if it is ``True`` or ``False`` (a NumPy bool is converted)."""
    if not isinstance(value, bool | np.bool_):
        raise ValueError(f"{name} must be True or False, got {name}={value!r}")
    return bool(value)
