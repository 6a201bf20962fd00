"""One behaviour for bad arguments across the package: the same mistake, the same error.

Each table lists every public function (and class) that takes a kind of argument; the same bad
values are tried on all of them. Every mistake raises ``ValueError`` whose message names the
argument and shows the value; NumPy integers (and, for real numbers, NumPy floats) are accepted
and give the same result as the Python number.
"""

from __future__ import annotations

import ast
import math
import re
from collections.abc import Callable
from pathlib import Path
from typing import Any

import numpy as np
import pytest
import torch

import rope_tutor as rt
from rope_tutor import runtime

X = torch.zeros(1, 3, 8)
P = torch.arange(3)


def same(a: Any, b: Any) -> bool:
    """Results equal, whether tensors, modules (compared by repr), tuples or numbers."""
    if isinstance(a, torch.Tensor):
        return torch.equal(a, b)
    if isinstance(a, torch.nn.Module):
        return repr(a) == repr(b)
    if isinstance(a, tuple):
        return len(a) == len(b) and all(same(x, y) for x, y in zip(a, b, strict=True))
    return a == b


#: Arguments for which None is a valid value (the default), so not a bad input there.
NONE_IS_VALID = {
    "apply_rope(rotary_dim)",
    "apply_rope_fast(rotary_dim)",
    "RotaryEmbedding(rotary_dim)",
    "rope_parameters(seq_len)",
    "effective_scale_factors(seq_len)",
    "alibi_bias(key_len)",
}


def cases(functions: dict, bad_values: list) -> list:
    """(function, bad value) pairs, without None where None is the argument's default."""
    return [
        pytest.param(function, bad, id=f"{function}-{bad!r}")
        for function in functions
        for bad in bad_values
        if not (bad is None and function in NONE_IS_VALID)
    ]


def expect_error(call: Callable[[], Any], name: str, value: Any) -> None:
    with pytest.raises(ValueError, match=re.escape(f"{name}={value!r}")):
        call()


# -- even sizes: a head dim or encoding dim, features in pairs ----------------------------------

EVEN_DIM = {
    "sinusoidal_frequencies": (lambda d: rt.sinusoidal_frequencies(d), "dim"),
    "sinusoidal_encoding": (lambda d: rt.sinusoidal_encoding(4, d), "dim"),
    "sinusoidal_relative_map": (lambda d: rt.sinusoidal_relative_map(1.0, d), "dim"),
    "rope_frequencies": (lambda d: rt.rope_frequencies(d), "dim"),
    "rope_matrix": (lambda d: rt.rope_matrix(1, d), "dim"),
    "interleaved_to_half_permutation": (
        lambda d: rt.interleaved_to_half_permutation(d),
        "head_dim",
    ),
    "half_to_interleaved_permutation": (
        lambda d: rt.half_to_interleaved_permutation(d),
        "head_dim",
    ),
    "RotaryEmbedding": (lambda d: rt.RotaryEmbedding(d), "dim"),
    "apply_rope(rotary_dim)": (lambda d: rt.apply_rope(X, P, rotary_dim=d), "rotary_dim"),
    "apply_rope_fast(rotary_dim)": (
        lambda d: rt.apply_rope_fast(X, P, rotary_dim=d),
        "rotary_dim",
    ),
    "RotaryEmbedding(rotary_dim)": (lambda d: rt.RotaryEmbedding(8, rotary_dim=d), "rotary_dim"),
    "rotations_per_window": (lambda d: rt.rotations_per_window(d, 10000.0, 64), "dim"),
    "ntk_scaled_base": (lambda d: rt.ntk_scaled_base(10000.0, 2.0, d), "dim"),
    "yarn_correction_range": (lambda d: rt.yarn_correction_range(d, 10000.0, 64), "dim"),
    "yarn_ramp": (lambda d: rt.yarn_ramp(d, 10000.0, 64), "dim"),
    "effective_scale_factors": (lambda d: rt.effective_scale_factors(d), "dim"),
    "rope_parameters": (lambda d: rt.rope_parameters(d), "dim"),
}


@pytest.mark.parametrize(("function", "bad"), cases(EVEN_DIM, [7, 0, -2, 8.0, True, "8", None]))
def test_bad_even_dims(function: str, bad: Any) -> None:
    call, name = EVEN_DIM[function]
    expect_error(lambda: call(bad), name, bad)


@pytest.mark.parametrize("function", list(EVEN_DIM))
def test_numpy_integer_dims(function: str) -> None:
    call, _ = EVEN_DIM[function]
    for value in (np.int64(8), np.int32(8)):
        assert same(call(value), call(8))


# -- base: a finite real number greater than 1 ---------------------------------------------------

BASE = {
    "sinusoidal_frequencies": lambda b: rt.sinusoidal_frequencies(8, b),
    "sinusoidal_encoding": lambda b: rt.sinusoidal_encoding(4, 8, b),
    "sinusoidal_relative_map": lambda b: rt.sinusoidal_relative_map(1.0, 8, b),
    "rope_frequencies": lambda b: rt.rope_frequencies(8, b),
    "rope_matrix": lambda b: rt.rope_matrix(1, 8, base=b),
    "apply_rope": lambda b: rt.apply_rope(X, P, base=b),
    "apply_rope_fast": lambda b: rt.apply_rope_fast(X, P, base=b),
    "apply_rope_complex": lambda b: rt.apply_rope_complex(X, P, base=b),
    "RotaryEmbedding": lambda b: rt.RotaryEmbedding(8, base=b),
    "rotations_per_window": lambda b: rt.rotations_per_window(8, b, 64),
    "ntk_scaled_base": lambda b: rt.ntk_scaled_base(b, 2.0, 8),
    "yarn_correction_range": lambda b: rt.yarn_correction_range(8, b, 64),
    "yarn_ramp": lambda b: rt.yarn_ramp(8, b, 64),
    "effective_scale_factors": lambda b: rt.effective_scale_factors(8, b),
    "rope_parameters": lambda b: rt.rope_parameters(8, b),
}
BAD_BASES = [math.inf, -math.inf, math.nan, 1.0, 1, 0.5, 0, -10.0, True, "10000", None]


@pytest.mark.parametrize("bad", BAD_BASES, ids=repr)
@pytest.mark.parametrize("function", list(BASE))
def test_bad_bases(function: str, bad: Any) -> None:
    with pytest.raises(ValueError, match=re.escape(f"greater than 1, got base={bad!r}")):
        BASE[function](bad)


@pytest.mark.parametrize("function", list(BASE))
def test_numpy_bases(function: str) -> None:
    call = BASE[function]
    for value in (np.float64(500.0), np.int64(500), 500):
        assert same(call(value), call(500.0))


# -- counts: positive ints, or ints >= 0 for lengths ----------------------------------------------

POSITIVE = {
    "sinusoidal_encoding(num_positions)": (lambda n: rt.sinusoidal_encoding(n, 4), "num_positions"),
    "LearnedPositionalEmbedding(max_positions)": (
        lambda n: rt.LearnedPositionalEmbedding(n, 4),
        "max_positions",
    ),
    "LearnedPositionalEmbedding(dim)": (lambda n: rt.LearnedPositionalEmbedding(4, n), "dim"),
    "alibi_slopes": (lambda n: rt.alibi_slopes(n), "num_heads"),
    "alibi_bias(num_heads)": (lambda n: rt.alibi_bias(n, 3), "num_heads"),
    "alibi_attention(block_size)": (
        lambda n: rt.alibi_attention(X[None], X[None], X[None], block_size=n),
        "block_size",
    ),
    "SelfAttention(dim)": (lambda n: rt.SelfAttention(n, 1), "dim"),
    "SelfAttention(num_heads)": (lambda n: rt.SelfAttention(4, n), "num_heads"),
    "interleaved_to_half_permutation(num_heads)": (
        lambda n: rt.interleaved_to_half_permutation(4, n),
        "num_heads",
    ),
    "rotations_per_window(window)": (lambda n: rt.rotations_per_window(8, 1e4, n), "window"),
    "rope_parameters(seq_len)": (lambda n: rt.rope_parameters(8, seq_len=n), "seq_len"),
    "effective_scale_factors(seq_len)": (
        lambda n: rt.effective_scale_factors(8, seq_len=n),
        "seq_len",
    ),
    "yarn_ramp(original_max_position_embeddings)": (
        lambda n: rt.yarn_ramp(8, 1e4, n),
        "original_max_position_embeddings",
    ),
}
NON_NEGATIVE = {
    "alibi_bias(query_len)": (lambda n: rt.alibi_bias(2, n, 4), "query_len"),
    "alibi_bias(key_len)": (lambda n: rt.alibi_bias(2, 0, n), "key_len"),
    "causal_mask(query_len)": (lambda n: rt.causal_mask(n, 4), "query_len"),
    "causal_mask(key_len)": (lambda n: rt.causal_mask(0, n), "key_len"),
    "seed_everything(seed)": (lambda n: runtime.seed_everything(n, threads=None), "seed"),
}


@pytest.mark.parametrize(("function", "bad"), cases(POSITIVE, [0, -1, 2.0, True, "3", None]))
def test_bad_positive_counts(function: str, bad: Any) -> None:
    call, name = POSITIVE[function]
    expect_error(lambda: call(bad), name, bad)


@pytest.mark.parametrize(("function", "bad"), cases(NON_NEGATIVE, [-1, 2.0, True, "3", None]))
def test_bad_non_negative_counts(function: str, bad: Any) -> None:
    call, name = NON_NEGATIVE[function]
    expect_error(lambda: call(bad), name, bad)


@pytest.mark.parametrize("function", [*POSITIVE, *NON_NEGATIVE])
def test_numpy_integer_counts(function: str) -> None:
    call, _ = {**POSITIVE, **NON_NEGATIVE}[function]
    for value in (np.int64(4), np.int32(4)):
        torch.manual_seed(0)  # modules start from random weights
        got = call(value)
        torch.manual_seed(0)
        assert same(got, call(4))


def test_bad_thread_count() -> None:
    for bad in (0, 2.0, True):
        expect_error(lambda bad=bad: runtime.seed_everything(0, threads=bad), "threads", bad)


# -- real numbers: finite, not bool ---------------------------------------------------------------


@pytest.mark.parametrize("bad", [math.inf, math.nan, True, "1"], ids=repr)
@pytest.mark.parametrize(
    ("call", "name"),
    [
        (lambda v: rt.sinusoidal_relative_map(v, 8), "offset"),
        (lambda v: rt.rope_matrix(v, 8), "position"),
        (lambda v: rt.yarn_mscale(v), "factor"),
        (lambda v: rt.yarn_ramp(8, 1e4, 64, beta_fast=v), "beta_fast"),
        (lambda v: rt.rope_parameters(8, scaling={"rope_type": "linear", "factor": v}), "factor"),
        (
            lambda v: rt.rope_parameters(
                8,
                scaling={"rope_type": "yarn", "factor": 2.0, "original_max_position_embeddings": v},
            ),
            "original_max_position_embeddings",
        ),
        (lambda v: rt.attention(X, X, X, scale=v), "scale"),
    ],
    ids=["offset", "position", "yarn_mscale", "beta_fast", "factor", "window", "scale"],
)
def test_bad_real_numbers(call: Callable[[Any], Any], name: str, bad: Any) -> None:
    expect_error(lambda: call(bad), name, bad)


def test_numpy_floats_in_a_scaling_dict() -> None:
    numpy_setting = {"rope_type": "linear", "factor": np.float64(4.0)}
    assert same(
        rt.rope_parameters(8, scaling=numpy_setting),
        rt.rope_parameters(8, scaling={"rope_type": "linear", "factor": 4.0}),
    )


# -- the package's imports run one way -------------------------------------------------------------

PACKAGE = Path(rt.__file__).parent
CORE = ["_checks", "absolute", "attention", "rope", "scaling", "alibi", "runtime", "fast"]


def package_imports(tree: ast.AST) -> set[str]:
    """The rope_tutor submodules an AST imports (``from rope_tutor import m`` counts as m)."""
    found = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.ImportFrom) and (node.module or "").startswith("rope_tutor"):
            if node.module == "rope_tutor":
                found.update(alias.name for alias in node.names)
            else:
                found.add(node.module.split(".")[1])
        elif isinstance(node, ast.Import):
            found.update(
                alias.name.split(".")[1]
                for alias in node.names
                if alias.name.startswith("rope_tutor.")
            )
    return found


def test_imports_run_one_way() -> None:
    graph, hidden = {}, []
    for name in CORE:
        tree = ast.parse((PACKAGE / f"{name}.py").read_text())
        graph[name] = package_imports(ast.Module(body=tree.body, type_ignores=[])) - {"rt"}
        for function in ast.walk(tree):
            if isinstance(function, ast.FunctionDef | ast.AsyncFunctionDef):
                hidden += [(name, function.name, m) for m in package_imports(function)]
    assert hidden == []  # no function-level import hides a dependency
    # Hugging Face's layout: the registry does not import the model code; Part VI imports Part II.
    assert "rope" not in graph["scaling"] and "fast" not in graph["scaling"]
    assert "fast" not in graph["rope"]
    assert {"rope"} <= graph["fast"]

    def reaches(start: str, goal: str, seen: frozenset = frozenset()) -> bool:
        return any(
            m == goal or (m in graph and m not in seen and reaches(m, goal, seen | {m}))
            for m in graph.get(start, ())
        )

    assert not [m for m in CORE if reaches(m, m)]  # no cycle among the core modules
