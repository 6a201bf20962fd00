"""The exercise framework: cases, known mistakes, the registry and ``check``.

The checker modules (``absolute``, ``rope``, ``alibi``, ``scaling``) import this module and register
their exercises; the package ``rope_tutor.exercises`` imports them in the order of the book.
Imports run one way: framework <- checker modules <- package.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any

import torch

__all__ = [
    "Case",
    "Exercise",
    "Mistake",
    "check",
    "compare_outputs",
    "dtype_difference",
    "get_exercise",
    "list_exercises",
    "register",
]


@dataclass(frozen=True)
class Case:
    """One input of an exercise.

    ``make`` returns ``(args, kwargs)`` and is called afresh for every function that runs on the
    case, so each gets its own copy of the tensors. ``description`` is shown to the learner.
    """

    description: str
    make: Callable[[], tuple[tuple[Any, ...], dict[str, Any]]]

    @classmethod
    def of(cls, *args: Any, **kwargs: Any) -> Case:
        """A case with literal (non-tensor) arguments; the description is the call's arguments."""
        parts = [repr(a) for a in args] + [f"{k}={v!r}" for k, v in kwargs.items()]
        return cls(", ".join(parts), lambda: (args, dict(kwargs)))


@dataclass(frozen=True)
class Mistake:
    """A typical wrong answer and what to tell the learner who made it."""

    message: str
    implementation: Callable[..., Any]


@dataclass(frozen=True)
class Exercise:
    """An exercise: its reference, the inputs it is checked on, and how to compare outputs.

    The dtype policy, the same for every exercise (see ``dtype_difference``): an index
    answer (the reference returns an integer tensor) may have any signed integer dtype; a
    boolean answer is a bool tensor; a float answer has exactly the dtype of the reference's
    output, which is the dtype of the float tensors the exercise passes in, or, for an exercise
    whose inputs are plain numbers, the dtype its text states. ``dtype`` is that stated dtype
    (for example ``torch.float32`` for a table the chapter asks to return as float32); it is
    ``None`` for an exercise whose float inputs fix the dtype. The tests check that every
    reference returns the dtype the policy asks for.
    The values are compared first; an answer whose values are right on every input but whose
    dtype breaks the policy is then rejected with a message that names the expected and the got.
    """

    name: str
    summary: str
    signature: str
    reference: Callable[..., Any]
    cases: Sequence[Case]
    hint: str
    mistakes: Sequence[Mistake] = ()
    rtol: float = 1e-5
    atol: float = 1e-5
    chapter: str = ""
    compare: Callable[[Any, Any, float, float], str | None] | None = field(default=None)
    dtype: torch.dtype | None = None

    def difference(self, expected: Any, got: Any) -> str | None:
        """``None`` when ``got`` matches ``expected``, else a short description of the gap."""
        compare = self.compare or compare_outputs
        return compare(expected, got, self.rtol, self.atol)


_REGISTRY: dict[str, Exercise] = {}


def register(exercise: Exercise) -> Exercise:
    """Add an exercise to the registry. Raises ``ValueError`` if its name is already taken."""
    if exercise.name in _REGISTRY:
        raise ValueError(f"exercise name {exercise.name!r} is already registered")
    if not exercise.cases:
        raise ValueError(f"exercise {exercise.name!r} has no cases")
    _REGISTRY[exercise.name] = exercise
    return exercise


def list_exercises() -> list[str]:
    """The names accepted by :func:`check`, in the order of the book."""
    return list(_REGISTRY)


def get_exercise(name: str) -> Exercise:
    """The registered exercise called ``name``; ``KeyError`` naming the valid names otherwise."""
    try:
        return _REGISTRY[name]
    except KeyError:
        raise KeyError(f"no exercise named {name!r}; known exercises: {list_exercises()}") from None


def _describe(value: Any) -> str:
    if isinstance(value, torch.Tensor):
        return f"tensor of shape {tuple(value.shape)} and dtype {value.dtype}"
    if isinstance(value, tuple | list):
        return f"{type(value).__name__} of {len(value)}: [" + ", ".join(map(_describe, value)) + "]"
    text = repr(value)
    return text if len(text) <= 60 else text[:57] + "..."


def compare_outputs(expected: Any, got: Any, rtol: float, atol: float) -> str | None:
    """Compare tensors (shape first, then values), numbers, and tuples/lists of them.

    Returns ``None`` when they match, else a one-line description of the first difference.
    """
    if isinstance(expected, torch.Tensor):
        if not isinstance(got, torch.Tensor):
            return f"expected a {_describe(expected)}, got {_describe(got)}"
        if tuple(got.shape) != tuple(expected.shape):
            return f"expected shape {tuple(expected.shape)}, got shape {tuple(got.shape)}"
        if expected.dtype == torch.bool or not expected.dtype.is_floating_point:
            if not torch.equal(got.cpu().to(expected.dtype), expected.cpu()):
                return "the values differ"
            return None
        exp = expected.detach().cpu().double()
        val = got.detach().cpu().double()
        # -inf (masked) entries must match exactly; compare finite entries numerically.
        if not torch.equal(torch.isinf(exp) & (exp < 0), torch.isinf(val) & (val < 0)):
            return "the masked (-inf) entries are not where they should be"
        finite = torch.isfinite(exp)
        if not torch.isfinite(val[finite]).all():
            return "your output has inf or nan where a finite value was expected"
        try:  # the tolerance rule is torch.testing's: |got - expected| <= atol + rtol * |expected|
            torch.testing.assert_close(val[finite], exp[finite], rtol=rtol, atol=atol)
        except AssertionError:
            worst = (val[finite] - exp[finite]).abs().max().item()
            flat = int((val - exp).abs().nan_to_num(0.0).flatten().argmax())
            index = tuple(int(i) for i in torch.unravel_index(torch.tensor(flat), exp.shape))
            return (
                f"values differ; the largest difference, {worst:.3g}, is at {index}: "
                f"expected {exp[index].item():.6g}, got {val[index].item():.6g}"
            )
        return None
    if isinstance(expected, tuple | list):
        if not isinstance(got, tuple | list) or len(got) != len(expected):
            return f"expected a {_describe(expected)}, got {_describe(got)}"
        for i, (e, g) in enumerate(zip(expected, got, strict=True)):
            diff = compare_outputs(e, g, rtol, atol)
            if diff is not None:
                return f"item {i}: {diff}"
        return None
    if isinstance(expected, float | int) and not isinstance(expected, bool):
        if isinstance(got, torch.Tensor) and got.numel() == 1:
            got = got.item()
        if not isinstance(got, float | int) or isinstance(got, bool):
            return f"expected a number, got {_describe(got)}"
        if abs(got - expected) > atol + rtol * abs(expected):
            return f"expected {expected:.6g}, got {got:.6g}"
        return None
    return None if got == expected else f"expected {_describe(expected)}, got {_describe(got)}"


def _dtype_kind(dtype: torch.dtype) -> str:
    if dtype == torch.bool:
        return "bool"
    if dtype.is_floating_point or dtype.is_complex:
        return "float"
    # torch indexes with signed integers; a uint8 tensor used as an index is read as a mask
    return "integer" if dtype.is_signed else "unsigned"


def dtype_difference(expected: Any, got: Any) -> str | None:
    """``None`` when ``got`` follows the dtype policy, tensor by tensor, else what breaks it.

    ``expected`` (the reference's output) and ``got`` already match in value, and so in
    structure; tuples and lists are walked item by item. The policy: where ``expected`` has an
    integer tensor, ``got`` may have any signed integer dtype (an index is an index, int32 or
    int64; torch reads a uint8 index as a mask); a
    bool tensor must be bool; a float tensor must have exactly ``expected``'s dtype. Returns a
    one-line description of the first tensor that breaks it, naming the expected and the got
    dtype.
    """
    if isinstance(expected, torch.Tensor) and isinstance(got, torch.Tensor):
        want = expected.dtype
        if _dtype_kind(want) == "integer":
            if _dtype_kind(got.dtype) != "integer":
                return (
                    f"expected a signed integer dtype (such as torch.int64), got dtype {got.dtype}"
                )
            return None
        if got.dtype != want:
            return f"expected dtype {want}, got dtype {got.dtype}"
        return None
    if isinstance(expected, tuple | list) and isinstance(got, tuple | list):
        for i, (e, g) in enumerate(zip(expected, got, strict=False)):
            problem = dtype_difference(e, g)
            if problem is not None:
                return f"item {i}: {problem}"
    return None


def _dtype_hint(exercise: Exercise, problem: str) -> str:
    """The hint after a dtype rejection: what the policy asks and how to follow it."""
    if "integer dtype" in problem:
        return (
            "an index answer may have any signed integer dtype (torch.arange gives int64); "
            "floats cannot index a tensor and torch reads bool or uint8 as a mask, so build the "
            "indices as integers or convert with .long()."
        )
    if "expected dtype torch.bool" in problem:
        return "the answer is a mask: return a bool tensor (a comparison such as a < b gives one)."
    if exercise.dtype is not None:
        return (
            f"the exercise asks for {exercise.dtype}; compute in whatever precision you like, "
            f"then return the result with .to({exercise.dtype})."
        )
    want = problem.split("expected dtype ", 1)[1].split(",", 1)[0]
    return (
        f"a float answer has the dtype of the float tensors passed in ({want} here); compute in "
        f"whatever precision you like, then return the result with .to(x.dtype), x being an input."
    )


def _run(fn: Callable[..., Any], case: Case) -> Any:
    args, kwargs = case.make()
    return fn(*args, **kwargs)


def _named_mistake(exercise: Exercise, case: Case, got: Any) -> str | None:
    for mistake in exercise.mistakes:
        try:
            wrong = _run(mistake.implementation, case)
        except Exception:  # a mistake's own implementation may not apply to every case
            continue
        if exercise.difference(wrong, got) is None:
            return mistake.message
    return None


def check(name: str, candidate: Callable[..., Any], *, verbose: bool = True) -> bool:
    """Run ``candidate`` on every input of exercise ``name`` and compare with the reference.

    Prints a short verdict (which input failed, expected vs got, a hint) when ``verbose`` and
    returns ``True`` only if every case matches. An exception raised by ``candidate`` is reported,
    never re-raised. Unknown names raise ``KeyError`` listing the known ones. An answer with the
    right values whose dtype breaks the policy of :class:`Exercise` (any integer dtype for
    indices, the inputs' or the stated float dtype for floats) is rejected too; values are judged
    first, so a wrong value is always what is reported when there is one.
    """
    exercise = get_exercise(name)
    if not callable(candidate):
        if verbose:
            print(f"✗ {name}: expected a function {exercise.signature}, got {_describe(candidate)}")
        return False

    results = []
    for number, case in enumerate(exercise.cases, start=1):
        expected = _run(exercise.reference, case)
        try:
            got = _run(candidate, case)
        except Exception as error:  # the learner's code may fail in any way
            if verbose:
                print(
                    f"✗ {name}: your function raised {type(error).__name__}: {error}\n"
                    f"  on input {number} of {len(exercise.cases)}: {case.description}\n"
                    f"  Hint: {exercise.hint}"
                )
            return False
        difference = exercise.difference(expected, got)
        if difference is not None:
            if verbose:
                named = _named_mistake(exercise, case, got)
                print(
                    f"✗ {name}: wrong on input {number} of {len(exercise.cases)}: "
                    f"{case.description}\n"
                    f"  {difference}\n"
                    f"  Hint: {named or exercise.hint}"
                )
            return False
        results.append((number, case, expected, got))
    for number, case, expected, got in results:
        problem = dtype_difference(expected, got)
        if problem is not None:
            if verbose:
                print(
                    f"✗ {name}: the values are right, the dtype is not, on input {number} of "
                    f"{len(exercise.cases)}: {case.description}\n"
                    f"  {problem}\n"
                    f"  Hint: {_dtype_hint(exercise, problem)}"
                )
            return False
    if verbose:
        print(f"✓ {name}: correct on all {len(exercise.cases)} test inputs.")
    return True
