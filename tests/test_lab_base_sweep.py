"""Step 1c of the lab, the base sweep (``rope_tutor.lab.base_sweep``), and chapter 11 on it.

References: the base of every saved arm is checked against RoPE's definition
theta_i = b^(-2i/d_h) (Su et al., 2021, eq. 15), computed here from the saved configuration with
``math`` alone and compared with the angles the rebuilt model's rotary module produces; the
chapter's summaries (paired Student-t intervals over seeds, t_2 = 4.303 from the t table, and
the crossed seeds-and-windows interval of Clark, 1973) are re-derived here from
``base_sweep.json`` with numpy and compared with what the chapter glues and asserts.
"""

from __future__ import annotations

import ast
import json
import math
from dataclasses import replace
from pathlib import Path

import numpy as np
import pytest
import torch
from scipy import stats as scipy_stats

from rope_tutor.lab.base_sweep import arm_key
from rope_tutor.lab.model import ModelConfig, TinyLM
from rope_tutor.lab.settings import BOOK, QUICK
from rope_tutor.results import RESULTS_DIR

DATA = RESULTS_DIR / "lab"
CHAPTER = Path(__file__).resolve().parents[1] / "book" / "11_lab_train_short_test_long.ipynb"
#: Step 1's base trained again reproduces step 1's saved means within this (the bound the
#: ``heldout-short-long`` step met for RoPE; see tests/test_lab_heldout.py).
REPRODUCTION_BOUND = 1e-4
#: Student's t at 97.5 % with 2 degrees of freedom, from the t table.
T_2 = 4.302652729911275


def _saved(name: str = "base_sweep.json") -> dict[int, dict]:
    return {
        seed: json.loads((DATA / f"seed_{seed}" / name).read_text(encoding="utf-8"))
        for seed in BOOK.seeds
    }


def _angles(model: TinyLM) -> torch.Tensor:
    """The angle (rad) by which each pair of the model's rotary module turns per position."""
    cos, sin = model.blocks[0].attn.rotary.cos_sin(torch.tensor([1]), torch.float32)
    return torch.atan2(sin[0].double(), cos[0].double())


def test_every_saved_arm_has_the_base_its_configuration_says() -> None:
    step1 = ModelConfig(encoding="rope")
    for seed, run in _saved().items():
        assert list(run["arms"]) == [arm_key(b) for b in BOOK.rope_bases], seed
        for key, arm in run["arms"].items():
            config = ModelConfig(**arm["model"])
            assert config.rope_base == arm["rope_base"] == arm["rotary_base"] == float(key)
            assert replace(config, rope_base=step1.rope_base) == step1  # only the base differs
            d_h = config.dim // config.num_heads
            theta = [config.rope_base ** (-2 * i / d_h) for i in range(d_h // 2)]
            assert torch.allclose(
                _angles(TinyLM(config)),
                torch.tensor(theta, dtype=torch.float64),
                rtol=1e-6,
                atol=0.0,
            )
            # a pair is short of a turn in T when its wavelength 2 pi / theta_i exceeds T
            short = sum(2 * math.pi / t > BOOK.context for t in theta)
            assert (arm["pairs"], arm["pairs_short_of_a_turn"]) == (d_h // 2, short), (seed, key)


def test_the_model_built_for_a_base_turns_at_that_base() -> None:
    """A fast check that the base reaches the model: two bases give different angles, each the
    definition's, and step 1's default is 10^4."""
    a = TinyLM(ModelConfig(encoding="rope", rope_base=500.0))
    b = TinyLM(ModelConfig(encoding="rope"))
    assert _angles(a)[-1].item() == pytest.approx(500.0 ** (-30 / 32), rel=1e-6)
    assert _angles(b)[-1].item() == pytest.approx(1e4 ** (-30 / 32), rel=1e-6)
    with pytest.raises(ValueError, match="rope_base"):
        from rope_tutor.lab.short_long import train_language_model

        train_language_model("alibi", QUICK, None, rope_base=500.0)  # type: ignore[arg-type]
    with pytest.raises(ValueError, match="base=0.5"):
        arm_key(0.5)


def test_saved_provenance_names_the_step_its_seeds_and_the_samples() -> None:
    step1 = _saved("train_short_test_long.json")
    held = _saved("heldout_short_long.json")
    for seed, run in _saved().items():
        prov = run["provenance"]
        assert prov["command"] == "python -m rope_tutor.lab base-sweep"
        assert (prov["settings"], prov["run_seed"], prov["threads"]) == ("book", seed, 2)
        assert (
            prov["seed"] == BOOK.for_seed(seed).pretrain.seed == step1[seed]["provenance"]["seed"]
        )
        assert prov["steps"] == BOOK.pretrain.steps == step1[seed]["provenance"]["steps"]
        assert prov["bases"] == list(BOOK.rope_bases) == run["protocol"]["bases"]
        assert (prov["eval_seed"], prov["heldout_seed"]) == (1234, 2027)
        for key in ("train_sha256", "validation_sha256", "train_bytes", "validation_bytes"):
            assert prov[key] == step1[seed]["provenance"][key], key
        assert run["samples"] == held[seed]["samples"]  # the same two samples of windows
        for arm in run["arms"].values():
            assert list(arm["book"]) == list(arm["heldout"]) == [str(m) for m in BOOK.multiples]
            for m in arm["book"]:
                assert len(arm["book"][m]) == BOOK.eval_windows
                assert len(arm["heldout"][m]) == BOOK.heldout_windows
            assert len(arm["train_loss"]) == BOOK.pretrain.steps // 10


def test_step_1s_base_trained_again_gives_back_step_1s_numbers() -> None:
    """Re-derived from the files, not from the step's own ``reproduction`` record (which must
    say the same): base 10^4 is step 1's RoPE arm, so the sweep's set-up is step 1's."""
    step1, held = _saved("train_short_test_long.json"), _saved("heldout_short_long.json")
    for seed, run in _saved().items():
        ours = run["arms"][arm_key(ModelConfig().rope_base)]
        worst = max(
            abs(np.mean(ours["book"][m]) - step1[seed]["arms"]["rope"]["fixed_target"][m]["mean"])
            for m in ours["book"]
        )
        assert worst < REPRODUCTION_BOUND, (seed, worst)
        windows = max(
            abs(a - b)
            for sample in ("book", "heldout")
            for m in ours[sample]
            for a, b in zip(ours[sample][m], held[seed]["arms"]["rope"][sample][m], strict=True)
        )
        assert windows < REPRODUCTION_BOUND, (seed, windows)
        record = run["reproduction"]
        assert record["step1_means_max_abs"] == pytest.approx(worst, abs=1e-6)
        assert record["heldout_windows_max_abs"] == pytest.approx(windows, abs=1e-6)
        assert record["step1_means_compared"] == len(BOOK.multiples)


# ----------------------------------------------------------------------------------------------
# Chapter 11's section "What the base does to a trained model", re-derived from the saved file


#: Glued comparison -> (comparison of ``_rederived``, sample, digits the prose prints).
GLUED_COMPARISONS = {
    f"{glue}{suffix}": (comparison, sample, 3)
    for glue, comparison in {
        "bs_20_16": "20 - 10000 at 16x",
        "bs_20_1": "20 - 10000 at 1x",
        "bs_1e6_2": "1000000 - 10000 at 2x",
        "bs_1e6_1": "1000000 - 10000 at 1x",
        "bs_500_1": "500 - 10000 at 1x",
        "bs_500_16": "500 - 10000 at 16x",
        "bs_1e6_16": "1000000 - 10000 at 16x",
    }.items()
    for suffix, sample in (("", "book"), ("_ho", "heldout"))
}
#: Glued mean loss over seeds -> (base, multiple, sample, digits).
GLUED_LEVELS = {f"bs_loss_{arm_key(b)}_16": (arm_key(b), 16, "book", 2) for b in BOOK.rope_bases}


def _seed_means(run: dict[int, dict], key: str, m: int) -> np.ndarray:
    """Base ``key``'s mean loss over the book's windows at ``m`` x T: one per seed."""
    return np.array([np.mean(run[s]["arms"][key]["book"][str(m)]) for s in BOOK.seeds])


def _heldout(run: dict[int, dict], key: str, m: int) -> np.ndarray:
    """Base ``key``'s held-out losses at ``m`` x T: (seeds, windows)."""
    return np.array([run[s]["arms"][key]["heldout"][str(m)] for s in BOOK.seeds])


def _seeds_interval(d: np.ndarray) -> tuple[float, float, float]:
    """Mean of three per-seed values and its Student-t 95 % interval (t_2 from the table)."""
    assert d.shape == (3,)
    half = T_2 * d.std(ddof=1) / math.sqrt(3)
    return float(d.mean()), float(d.mean() - half), float(d.mean() + half)


def _crossed_interval(d: np.ndarray) -> tuple[float, float, float]:
    """Clark's (1973) seeds-and-windows interval of the mean of d (seeds, windows): variance
    (MS_seeds + MS_windows) / (n_s n_w), Welch-Satterthwaite degrees of freedom, never narrower
    than the seeds alone."""
    n_s, n_w = d.shape
    grand = d.mean()
    ms_s = n_w * ((d.mean(axis=1) - grand) ** 2).sum() / (n_s - 1)
    ms_w = n_s * ((d.mean(axis=0) - grand) ** 2).sum() / (n_w - 1)
    nu = (ms_s + ms_w) ** 2 / (ms_s**2 / (n_s - 1) + ms_w**2 / (n_w - 1))
    half = scipy_stats.t.ppf(0.975, nu) * math.sqrt((ms_s + ms_w) / (n_s * n_w))
    half = max(half, _seeds_interval(d.mean(axis=1))[2] - grand)
    return float(grand), float(grand - half), float(grand + half)


def _rederived() -> dict[str, dict[str, tuple[float, float, float]]]:
    """Every comparison the section draws: base k minus base 10^4 at each multiple, and how much
    more its loss grows from 1x to each longer multiple, on both samples."""
    run, ref = _saved(), "10000"
    out = {}
    for key in (arm_key(b) for b in BOOK.rope_bases if arm_key(b) != ref):
        for m in BOOK.multiples:
            out[f"{key} - {ref} at {m}x"] = {
                "book": _seeds_interval(_seed_means(run, key, m) - _seed_means(run, ref, m)),
                "heldout": _crossed_interval(_heldout(run, key, m) - _heldout(run, ref, m)),
            }
        for m in BOOK.multiples[1:]:
            grow = {k: _seed_means(run, k, m) - _seed_means(run, k, 1) for k in (key, ref)}
            held = {k: _heldout(run, k, m) - _heldout(run, k, 1) for k in (key, ref)}
            out[f"{key} - {ref} growth 1x-{m}x"] = {
                "book": _seeds_interval(grow[key] - grow[ref]),
                "heldout": _crossed_interval(held[key] - held[ref]),
            }
    return out


def _verdict(interval: tuple[float, float, float]) -> str:
    _, low, high = interval
    return "tie" if low <= 0 <= high else ("better" if high < 0 else "worse")


def _chapter_literal(name: str) -> object:
    """The value of ``name = <literal>`` in chapter 11's code cells."""
    notebook = json.loads(CHAPTER.read_text(encoding="utf-8"))
    for cell in notebook["cells"]:
        if cell["cell_type"] != "code":
            continue
        source = "".join(cell["source"])
        if "%pip" in source:  # the install cell: IPython magic, not Python
            continue
        for node in ast.walk(ast.parse(source)):
            if isinstance(node, ast.Assign) and getattr(node.targets[0], "id", "") == name:
                if isinstance(node.value, ast.Call):  # set(): no element
                    return set()
                return ast.literal_eval(node.value)
    raise AssertionError(f"chapter 11 assigns no {name}")


def _glued() -> dict[str, str]:
    """Every value chapter 11's stored outputs glue, as the prose prints it."""
    notebook = json.loads(CHAPTER.read_text(encoding="utf-8"))
    found = {}
    for cell in notebook["cells"]:
        for output in cell.get("outputs", []):
            name = output.get("metadata", {}).get("scrapbook", {}).get("name")
            if name:
                text = output["data"]["application/papermill.record/text/plain"]
                found[name] = text.strip("'")
    return found


def test_the_chapters_verdicts_on_the_base_are_rederived_from_the_saved_file() -> None:
    """The verdicts the chapter asserts (``BASE_VERDICTS``, on the book's windows) are those of
    independently computed intervals; every one that is not a tie keeps its sign on the held-out
    windows, or the chapter names it in ``BASE_FRAGILE``."""
    found = _rederived()
    asserted = _chapter_literal("BASE_VERDICTS")
    fragile = _chapter_literal("BASE_FRAGILE")
    assert isinstance(asserted, dict) and set(asserted) <= set(found)
    for name, expected in asserted.items():
        assert _verdict(found[name]["book"]) == expected, name
    for name, d in found.items():
        book, held = _verdict(d["book"]), _verdict(d["heldout"])
        keeps = book == "tie" or held == book
        assert keeps or name in fragile, (name, d)
        assert not (keeps and name in fragile), name


def test_the_chapters_glued_base_numbers_are_rederived_from_the_saved_file() -> None:
    glued, found = _glued(), _rederived()
    run = _saved()

    def interval(values: tuple[float, float, float], digits: int) -> str:
        mean, low, high = values  # a mean that rounds to zero prints as +0.000, bounds as they are
        mean = round(mean, digits) + 0.0
        return f"{mean:+.{digits}f} [{low:+.{digits}f}, {high:+.{digits}f}]"

    for name, (comparison, sample, digits) in GLUED_COMPARISONS.items():
        assert glued[name] == interval(found[comparison][sample], digits), name
    for key in (arm_key(b) for b in BOOK.rope_bases):
        short = run[BOOK.seeds[0]]["arms"][key]["pairs_short_of_a_turn"]
        assert glued[f"bs_short_{key}"] == str(short)
    for key in (arm_key(b) for b in BOOK.rope_bases):  # growth from 1x to 16x T, paired by seed
        growth = _seeds_interval(_seed_means(run, key, 16) - _seed_means(run, key, 1))
        assert glued[f"bs_grow_{key}"] == interval(growth, 2), key
    for name, (key, m, sample, digits) in GLUED_LEVELS.items():
        values = [np.mean(run[s]["arms"][key][sample][str(m)]) for s in BOOK.seeds]
        assert glued[name] == f"{np.mean(values):.{digits}f}", name
