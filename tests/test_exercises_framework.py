"""The exercise framework: check() judges candidates fairly and never crashes on learner code."""

from __future__ import annotations

import math

import pytest
import torch

from rope_tutor import exercises
from rope_tutor.exercises import (
    Case,
    Exercise,
    Mistake,
    check,
    compare_outputs,
    framework,
    list_exercises,
)


def _doubled(x: torch.Tensor) -> torch.Tensor:
    return 2 * x


def _tripled(x: torch.Tensor) -> torch.Tensor:
    return 3 * x


TOY = Exercise(
    name="toy_double",
    summary="double a tensor",
    signature="(x) -> Tensor",
    reference=_doubled,
    cases=(
        Case("x = [1, 2, 3]", lambda: ((torch.tensor([1.0, 2.0, 3.0]),), {})),
        Case("x = ones(2, 2)", lambda: ((torch.ones(2, 2),), {})),
    ),
    hint="multiply by two",
    mistakes=(Mistake("you tripled instead of doubling", _tripled),),
)


@pytest.fixture
def toy(monkeypatch: pytest.MonkeyPatch) -> Exercise:
    """TOY in the registry for one test only (the registry is process-wide)."""
    monkeypatch.setitem(framework._REGISTRY, TOY.name, TOY)
    return TOY


def test_accepts_a_right_answer(toy: Exercise, capsys: pytest.CaptureFixture[str]) -> None:
    assert check("toy_double", lambda x: x + x) is True
    assert "✓ toy_double: correct on all 2 test inputs" in capsys.readouterr().out


def test_rejects_a_wrong_answer_and_says_where(
    toy: Exercise, capsys: pytest.CaptureFixture[str]
) -> None:
    assert check("toy_double", lambda x: x + 1) is False
    out = capsys.readouterr().out
    assert "✗ toy_double: wrong on input 1 of 2: x = [1, 2, 3]" in out
    assert "Hint: multiply by two" in out


def test_names_a_known_mistake(toy: Exercise, capsys: pytest.CaptureFixture[str]) -> None:
    assert check("toy_double", lambda x: x * 3) is False
    assert "Hint: you tripled instead of doubling" in capsys.readouterr().out


def test_wrong_only_on_a_later_case(toy: Exercise, capsys: pytest.CaptureFixture[str]) -> None:
    def right_for_vectors_only(x: torch.Tensor) -> torch.Tensor:
        return 2 * x if x.dim() == 1 else x

    assert check("toy_double", right_for_vectors_only) is False
    assert "wrong on input 2 of 2: x = ones(2, 2)" in capsys.readouterr().out


def test_wrong_shape_is_reported(toy: Exercise, capsys: pytest.CaptureFixture[str]) -> None:
    assert check("toy_double", lambda x: (2 * x).flatten()[:2]) is False
    assert "expected shape (3,), got shape (2,)" in capsys.readouterr().out


def test_a_learners_exception_is_reported_not_raised(
    toy: Exercise, capsys: pytest.CaptureFixture[str]
) -> None:
    def broken(x: torch.Tensor) -> torch.Tensor:
        raise RuntimeError("shape mismatch in my code")

    assert check("toy_double", broken) is False
    out = capsys.readouterr().out
    assert "your function raised RuntimeError: shape mismatch in my code" in out
    assert "on input 1 of 2" in out


@pytest.mark.parametrize(
    "candidate",
    [
        lambda: None,  # wrong arity: TypeError
        lambda x: None,  # returns nothing
        lambda x: "twice",  # returns a string
        lambda x: [2 * x],  # wraps the answer
        lambda x: torch.full_like(x, float("nan")),
        lambda x: 1 / 0,
    ],
)
def test_never_crashes_on_odd_candidates(toy: Exercise, candidate: object) -> None:
    assert check("toy_double", candidate, verbose=False) is False


def test_a_candidate_that_mutates_its_input_cannot_fool_the_reference(toy: Exercise) -> None:
    def doubles_in_place(x: torch.Tensor) -> torch.Tensor:
        return x.mul_(2)

    # Each function gets fresh inputs, so the reference still sees the original x.
    assert check("toy_double", doubles_in_place, verbose=False) is True

    def zeroes_then_doubles(x: torch.Tensor) -> torch.Tensor:
        x.zero_()
        return 2 * x

    assert check("toy_double", zeroes_then_doubles, verbose=False) is False


def test_quiet_mode_prints_nothing(toy: Exercise, capsys: pytest.CaptureFixture[str]) -> None:
    check("toy_double", _doubled, verbose=False)
    check("toy_double", _tripled, verbose=False)
    assert capsys.readouterr().out == ""


def test_unknown_name_lists_the_known_ones() -> None:
    with pytest.raises(KeyError, match="no exercise named 'sinusoidal'.*sinusoidal_encoding"):
        check("sinusoidal", lambda: None)


def test_a_non_callable_candidate_is_refused(
    toy: Exercise, capsys: pytest.CaptureFixture[str]
) -> None:
    assert check("toy_double", torch.ones(3)) is False
    assert "expected a function (x) -> Tensor, got tensor of shape (3,)" in capsys.readouterr().out


def test_register_refuses_duplicates_and_empty_exercises(toy: Exercise) -> None:
    with pytest.raises(ValueError, match="'toy_double' is already registered"):
        exercises.register(TOY)
    empty = Exercise("toy_empty", "", "()", _doubled, cases=(), hint="")
    with pytest.raises(ValueError, match="'toy_empty' has no cases"):
        exercises.register(empty)


def test_every_registered_exercise_accepts_its_reference() -> None:
    names = list_exercises()
    assert len(names) == len(set(names))
    for name in names:
        exercise = exercises.get_exercise(name)
        assert check(name, exercise.reference, verbose=False), name
        assert exercise.signature.startswith("(")
        assert exercise.hint


def test_case_of_describes_its_arguments() -> None:
    case = Case.of(8, 6, base=100.0)
    assert case.description == "8, 6, base=100.0"
    assert case.make() == ((8, 6), {"base": 100.0})


# --- compare_outputs -------------------------------------------------------------------------


def test_compare_tensors() -> None:
    x = torch.tensor([1.0, 2.0])
    assert compare_outputs(x, x.clone(), 1e-5, 1e-5) is None
    assert compare_outputs(x, x + 1e-7, 1e-5, 1e-5) is None
    assert "the largest difference, 0.5, is at (1,): expected 2, got 2.5" in compare_outputs(
        x, torch.tensor([1.0, 2.5]), 1e-5, 1e-5
    )
    # Two wrong entries: the message names the one that differs most, not the first one.
    y = torch.tensor([1.0, 2.0, 3.0])
    message = compare_outputs(y, torch.tensor([1.1, 2.0, 5.0]), 1e-5, 1e-5)
    assert "the largest difference, 2, is at (2,): expected 3, got 5" in message
    assert "(0,)" not in message
    assert "expected a tensor" in compare_outputs(x, [1.0, 2.0], 1e-5, 1e-5)
    assert "inf or nan" in compare_outputs(x, torch.tensor([1.0, math.nan]), 1e-5, 1e-5)


def test_compare_masked_entries() -> None:
    masked = torch.tensor([0.0, -math.inf])
    assert compare_outputs(masked, masked.clone(), 1e-5, 1e-5) is None
    assert "masked (-inf)" in compare_outputs(masked, torch.tensor([0.0, -1e9]), 1e-5, 1e-5)


def test_compare_integer_and_bool_tensors() -> None:
    mask = torch.tensor([True, False])
    assert compare_outputs(mask, mask.clone(), 0, 0) is None
    assert compare_outputs(mask, ~mask, 0, 0) == "the values differ"


def test_compare_numbers_and_sequences() -> None:
    assert compare_outputs(1.0, 1.0 + 1e-9, 1e-5, 1e-5) is None
    assert compare_outputs(1.0, torch.tensor(1.0), 1e-5, 1e-5) is None
    assert compare_outputs(1.0, 2.0, 1e-5, 1e-5) == "expected 1, got 2"
    assert compare_outputs(1.0, True, 1e-5, 1e-5) == "expected a number, got True"
    pair = (torch.ones(2), 3.0)
    assert compare_outputs(pair, (torch.ones(2), 3.0), 1e-5, 1e-5) is None
    assert compare_outputs(pair, (torch.ones(2), 4.0), 1e-5, 1e-5).startswith("item 1:")
    assert "expected a tuple of 2" in compare_outputs(pair, (torch.ones(2),), 1e-5, 1e-5)
    assert compare_outputs("a", "b", 0, 0) == "expected 'a', got 'b'"


# --- the dtype an exercise's spec promises ---------------------------------------------------


TOY_FLOAT32 = Exercise(
    name="toy_double_float32",
    summary="double a tensor, as float32",
    signature="(x) -> float32 Tensor",
    reference=_doubled,
    cases=TOY.cases,
    hint="multiply by two",
    mistakes=TOY.mistakes,
    dtype=torch.float32,
)


def _pair_reference(x: torch.Tensor) -> tuple[torch.Tensor, float]:
    return 2 * x, 1.5


TOY_PAIR = Exercise(
    name="toy_pair_float32",
    summary="a float32 tensor and a number",
    signature="(x) -> (float32 Tensor, float)",
    reference=_pair_reference,
    cases=TOY.cases,
    hint="double x, and return 1.5",
    dtype=torch.float32,
)


@pytest.fixture
def typed(monkeypatch: pytest.MonkeyPatch) -> None:
    for exercise in (TOY_FLOAT32, TOY_PAIR, TOY):
        monkeypatch.setitem(framework._REGISTRY, exercise.name, exercise)


def test_a_right_answer_in_the_promised_dtype_passes(typed, capsys) -> None:
    assert check("toy_double_float32", lambda x: x + x) is True
    assert check("toy_pair_float32", lambda x: (x * 2.0, 1.5)) is True
    assert capsys.readouterr().out.count("✓") == 2


def test_right_values_in_another_dtype_are_rejected_with_both_dtypes_named(typed, capsys) -> None:
    def doubled_in_float64(x: torch.Tensor) -> torch.Tensor:
        return torch.tensor([2.0 * v for v in x.flatten().tolist()], dtype=torch.float64).reshape(
            x.shape
        )

    assert check("toy_double_float32", doubled_in_float64) is False
    out = capsys.readouterr().out
    assert "✗ toy_double_float32: the values are right, the dtype is not" in out
    assert "on input 1 of 2: x = [1, 2, 3]" in out
    assert "expected dtype torch.float32, got dtype torch.float64" in out
    assert ".to(torch.float32)" in out


def test_a_wrong_dtype_only_on_a_later_input_is_found(typed, capsys) -> None:
    def float64_for_matrices(x: torch.Tensor) -> torch.Tensor:
        return 2 * x if x.dim() == 1 else (2 * x).double()

    assert check("toy_double_float32", float64_for_matrices) is False
    assert "on input 2 of 2: x = ones(2, 2)" in capsys.readouterr().out


def test_values_are_judged_before_the_dtype(typed, capsys) -> None:
    assert check("toy_double_float32", lambda x: (3 * x).double()) is False
    out = capsys.readouterr().out
    assert "values differ" in out and "dtype" not in out
    assert "Hint: you tripled instead of doubling" in out


def test_the_dtype_of_a_tensor_inside_a_tuple_is_checked(typed, capsys) -> None:
    assert check("toy_pair_float32", lambda x: ((2 * x).half(), 1.5)) is False
    out = capsys.readouterr().out
    assert "item 0: expected dtype torch.float32, got dtype torch.float16" in out


def test_without_a_stated_dtype_the_inputs_dtype_is_required(typed, capsys) -> None:
    """TOY's inputs are float32, so its answer is float32: a float64 answer is refused."""
    assert TOY.dtype is None
    assert check("toy_double", lambda x: (2 * x).double()) is False
    out = capsys.readouterr().out
    assert "✗ toy_double: the values are right, the dtype is not, on input 1 of 2" in out
    assert "expected dtype torch.float32, got dtype torch.float64" in out
    assert "the dtype of the float tensors passed in (torch.float32 here)" in out
    assert ".to(x.dtype)" in out


def test_float64_inputs_ask_for_a_float64_answer(monkeypatch, capsys) -> None:
    """The same exercise on float64 inputs: the float64 answer passes, a float32 one does not."""
    toy64 = Exercise(
        name="toy_double_64",
        summary="double a float64 tensor",
        signature="(x) -> Tensor",
        reference=_doubled,
        cases=(Case("x = [1, 2] (float64)", lambda: ((torch.tensor([1.0, 2.0]).double(),), {})),),
        hint="multiply by two",
    )
    monkeypatch.setitem(framework._REGISTRY, toy64.name, toy64)
    assert check("toy_double_64", lambda x: x + x, verbose=False) is True
    assert check("toy_double_64", lambda x: (x + x).float()) is False
    assert "expected dtype torch.float64, got dtype torch.float32" in capsys.readouterr().out


def _indices(n: int) -> torch.Tensor:
    return torch.arange(n - 1, -1, -1)


INDEX_TOY = Exercise(
    name="toy_reversed_indices",
    summary="the indices n-1, ..., 0",
    signature="(n) -> integer Tensor[n]",
    reference=_indices,
    cases=(Case.of(4), Case.of(200)),
    hint="count down",
)


@pytest.mark.parametrize("dtype", [torch.int64, torch.int32, torch.int16])
def test_an_index_answer_may_have_any_signed_integer_dtype(monkeypatch, dtype) -> None:
    monkeypatch.setitem(framework._REGISTRY, INDEX_TOY.name, INDEX_TOY)
    assert check(INDEX_TOY.name, lambda n: _indices(n).to(dtype), verbose=False) is True


@pytest.mark.parametrize("dtype", [torch.float32, torch.float64, torch.uint8])
def test_an_index_answer_in_a_float_or_unsigned_dtype_is_refused(monkeypatch, capsys, dtype):
    """Right values, but torch cannot index with floats and reads uint8 as a mask."""
    monkeypatch.setitem(framework._REGISTRY, INDEX_TOY.name, INDEX_TOY)
    assert check(INDEX_TOY.name, lambda n: _indices(n).to(dtype)) is False
    out = capsys.readouterr().out
    assert "the values are right, the dtype is not, on input 1 of 2" in out
    assert f"expected a signed integer dtype (such as torch.int64), got dtype {dtype}" in out
    assert ".long()" in out


def test_a_mask_answer_must_be_bool(monkeypatch, capsys) -> None:
    mask_toy = Exercise(
        name="toy_mask",
        summary="x < 2",
        signature="(x) -> bool Tensor",
        reference=lambda x: x < 2,
        cases=TOY.cases,
        hint="compare",
    )
    monkeypatch.setitem(framework._REGISTRY, mask_toy.name, mask_toy)
    assert check("toy_mask", lambda x: x < 2, verbose=False) is True
    assert check("toy_mask", lambda x: (x < 2).long()) is False
    out = capsys.readouterr().out
    assert "expected dtype torch.bool, got dtype torch.int64" in out
    assert "return a bool tensor" in out


def _tensors(value) -> list[torch.Tensor]:
    if isinstance(value, torch.Tensor):
        return [value]
    if isinstance(value, tuple | list):
        return [t for v in value for t in _tensors(v)]
    if isinstance(value, dict):
        return [t for v in value.values() for t in _tensors(v)]
    return []


@pytest.mark.parametrize("name", list_exercises())
def test_every_reference_follows_the_dtype_policy(name: str) -> None:
    """Float answers have the float inputs' dtype, or else the dtype the exercise states."""
    exercise = exercises.get_exercise(name)
    for case in exercise.cases:
        args, kwargs = case.make()
        float_inputs = {t.dtype for t in _tensors((args, kwargs)) if t.is_floating_point()}
        outputs = {t.dtype for t in _tensors(exercise.reference(*args, **kwargs))}
        float_outputs = {d for d in outputs if d.is_floating_point}
        if float_inputs:  # the inputs fix the dtype; nothing else may be stated
            assert len(float_inputs) == 1 and float_outputs <= float_inputs, (name, case)
            assert exercise.dtype is None, name
        elif float_outputs:  # plain-number inputs: the exercise states the dtype
            assert float_outputs == {exercise.dtype}, (name, case)


@pytest.mark.parametrize(
    "name", [n for n in list_exercises() if exercises.get_exercise(n).dtype is not None]
)
def test_every_stated_dtype_is_enforced(name: str) -> None:
    """The reference returns the promised dtype; the same values in another dtype are refused."""
    exercise = exercises.get_exercise(name)
    other = torch.float32 if exercise.dtype == torch.float64 else torch.float64

    def recast(value):
        if isinstance(value, torch.Tensor):
            return value.to(other)
        if isinstance(value, tuple | list):
            return type(value)(recast(v) for v in value)
        return value

    def same_values_other_dtype(*args, **kwargs):
        return recast(exercise.reference(*args, **kwargs))

    assert check(name, exercise.reference, verbose=False)
    assert not check(name, same_values_other_dtype, verbose=False)


def test_the_exercises_whose_chapters_state_a_dtype_declare_it() -> None:
    """The chapters' exercise texts promise these dtypes (float32 tables, float64 matrices)."""
    stated = {
        "sinusoidal_encoding": torch.float32,
        "relative_map": torch.float32,
        "rope_matrix": torch.float64,
        "yarn_ramp": torch.float64,
        "alibi_slopes": torch.float32,
        "alibi_bias": torch.float32,
        "linear_scaling": torch.float32,
        "yarn_parameters": torch.float32,
    }
    for name, dtype in stated.items():
        assert exercises.get_exercise(name).dtype == dtype, name
