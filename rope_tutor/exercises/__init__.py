"""Exercise checkers: ``check(name, candidate)`` runs a learner's function against the reference.

Usage in a notebook::

    from rope_tutor.exercises import check, list_exercises

    def my_sinusoidal_encoding(num_positions, dim, base=10000.0):
        ...

    check("sinusoidal_encoding", my_sinusoidal_encoding)   # prints a verdict, returns True/False

Each exercise is registered once, in the checker module of its part (``absolute``, ``rope``,
``alibi``, ``scaling``, ``lab``, ``real``, ``fast``), with:

* deterministic test inputs (:class:`Case`, built from a fixed seed, fresh for every call so a
  candidate that modifies its input in place cannot corrupt the reference's input);
* the reference implementation (normally the package function itself);
* a comparison (tensors: shape, then values within a tolerance);
* a general hint, plus known wrong answers (:class:`Mistake`): when the candidate's output equals a
  known mistake's output, the checker names the mistake instead of just saying "wrong".

Names are stable: learners type them. ``check`` never raises because of the learner's code.
"""

from __future__ import annotations

from rope_tutor.exercises.framework import (
    Case,
    Exercise,
    Mistake,
    check,
    compare_outputs,
    get_exercise,
    list_exercises,
    register,
)

# Checker modules register their exercises on import, in the order of the book.
from rope_tutor.exercises import (  # noqa: I001  (book order, not alphabetical)
    absolute,  # noqa: F401  (Part I)
    rope,  # noqa: F401  (Part II)
    alibi,  # noqa: F401  (Part III)
    scaling,  # noqa: F401  (Part IV)
    lab,  # noqa: F401  (Part V)
    real,  # noqa: F401  (A real model past its window)
    fast,  # noqa: F401  (Part VI)
)

__all__ = [
    "Case",
    "Exercise",
    "Mistake",
    "check",
    "compare_outputs",
    "get_exercise",
    "list_exercises",
    "register",
]
