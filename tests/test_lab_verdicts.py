"""Chapter 12's verdicts (``rope_tutor.lab.verdicts``), checked against references computed here.

References: a paired difference is the one-sample Student-t interval of the per-seed differences
(mean +- t_{n-1, 0.975} sd / sqrt(n), sd with n - 1), computed with numpy and scipy's t quantile;
a verdict is the side of zero on which that interval lies; the printed numbers are checked on
values chosen to sit on each rounding edge.
"""

from __future__ import annotations

import math

import numpy as np
import pytest
from scipy.stats import t as student_t

from rope_tutor.lab.stats import Interval
from rope_tutor.lab.verdicts import (
    ClaimError,
    Verdicts,
    arm_label,
    digits_of,
    glued_values,
    keep,
    mean_text,
)

#: Three seeds' losses (nats/byte) of four made-up arms at 1x and 4x T.
LOSSES = {
    "rope": {1: [1.80, 1.85, 1.90], 4: [2.50, 2.40, 2.60]},
    "rope+pi": {1: [2.10, 2.20, 2.15], 4: [2.30, 2.35, 2.25]},
    "rope+ntk": {1: [1.81, 1.84, 1.92], 4: [2.51, 2.38, 2.62]},
    "finetune_plain": {1: [1.70, 1.90, 1.80], 4: [1.60, 1.65, 1.55]},
}


def _reference(a: list[float], b: list[float]) -> tuple[float, float, float]:
    d = np.asarray(a) - np.asarray(b)
    half = student_t.ppf(0.975, df=len(d) - 1) * d.std(ddof=1) / math.sqrt(len(d))
    return float(d.mean()), float(d.mean() - half), float(d.mean() + half)


def _by_hand(low: float, high: float) -> str:
    if low > 0:
        return "worse"  # a - b > 0: a has the higher loss
    if high < 0:
        return "better"
    return "tie"


@pytest.mark.parametrize(
    ("a", "b", "m", "m_b"),
    [("rope+pi", "rope", 1, 1), ("rope+pi", "rope", 4, 4), ("rope", "rope", 4, 1),
     ("finetune_plain", "rope+pi", 4, 1), ("rope+ntk", "rope", 1, 1)],
)  # fmt: skip
def test_diff_is_the_paired_t_interval_and_verdict_its_side_of_zero(a, b, m, m_b) -> None:
    ledger = Verdicts(LOSSES)
    d = ledger.diff(a, b, m, m_b)
    mean, low, high = _reference(LOSSES[a][m], LOSSES[b][m_b])
    assert (d.mean, d.low, d.high) == pytest.approx((mean, low, high), abs=1e-12)
    assert ledger.verdict(d) == _by_hand(low, high)
    assert ledger.spec[id(d)] == (a, b, m, m_b)


def test_the_verdicts_of_chosen_pairs() -> None:
    ledger = Verdicts(LOSSES)
    assert ledger.verdict(ledger.diff("rope+pi", "rope", 1)) == "worse"  # 0.30 higher, every seed
    assert ledger.verdict(ledger.diff("finetune_plain", "rope", 4)) == "better"
    assert ledger.verdict(ledger.diff("rope+ntk", "rope", 1)) == "tie"  # +0.01, -0.01, +0.02


def test_mean_is_the_one_sample_t_interval() -> None:
    values = LOSSES["rope"][4]
    interval = Verdicts(LOSSES).mean("rope", 4)
    half = student_t.ppf(0.975, df=2) * np.std(values, ddof=1) / math.sqrt(3)
    assert (interval.low, interval.high) == pytest.approx(
        (np.mean(values) - half, np.mean(values) + half), abs=1e-12
    )


def test_mean_text_and_digits_of_on_rounding_edges() -> None:
    def at(mean: float, low: float | None = None, high: float | None = None) -> Interval:
        return Interval(mean, mean if low is None else low, mean if high is None else high, 3)

    assert mean_text(at(0.0312)) == "+0.031"
    assert mean_text(at(-0.0312)) == "-0.031"
    assert mean_text(at(-0.0004)) == "-0.0004"  # rounds to zero at 3 decimals: one more
    assert mean_text(at(0.00004)) == "+0.00004"
    assert mean_text(at(-0.000001)) == "+0.00000"  # signed zero never printed
    assert mean_text(at(-0.0)) == "+0.000"
    assert mean_text(at(0.0005)) == "+0.001"  # not below half a unit of the 3rd decimal
    assert digits_of(at(0.1, 0.05, 0.15)) == 3
    assert digits_of(at(0.004, 0.001, 0.007)) == 4  # tiny: both bounds under 0.01
    assert digits_of(at(0.02, -0.0003, 0.04)) == 4  # a bound would print "-0.000"
    assert digits_of(at(0.02, -0.00003, 0.04)) == 5  # ... and "-0.0000"
    assert digits_of(at(0.02, 0.0, 0.04)) == 3  # an exact 0 prints "+0.000": no sign to hide
    for value in (-0.0003, -0.00003):
        interval = at(0.02, value, 0.04)
        assert "-0." + "0" * digits_of(interval) not in interval.format(
            digits_of(interval), signed=True
        )


def test_mean_text_with_fixed_digits_is_chapter_11s_signed_mean_and_magnitude() -> None:
    """Chapter 11 prints a mean with a fixed number of decimals: with its sign, rounded, never a
    signed zero; or its size alone (the formulas it used before the package's function)."""
    for mean in (0.123456, -0.123456, -0.0004, 0.0049, -0.005, 0.0, -0.0, 1.5, -2.25):
        interval = Interval(mean, mean - 1, mean + 1, 3)
        for digits in (2, 3):
            assert (
                mean_text(interval, digits, max_digits=digits)
                == f"{round(mean, digits) + 0.0:+.{digits}f}"
            )
            assert mean_text(interval, digits, max_digits=digits, signed=False) == (
                f"{abs(round(mean, digits)):.{digits}f}"
            )
    assert mean_text(Interval(-0.004, -0.005, -0.003, 3), 2, max_digits=2) == "+0.00"
    assert mean_text(Interval(-0.004, -0.005, -0.003, 3), 2) == "-0.004"  # widened to 3
    with pytest.raises(ValueError, match="digits=4, max_digits=3"):
        mean_text(Interval(0.1, 0.0, 0.2, 3), 4, max_digits=3)


def test_glued_values_and_keep() -> None:
    d = Interval(-0.0123, -0.02, -0.005, 3)
    assert glued_values("x", d) == {
        "x": "-0.012",
        "x_ci": "-0.012 [-0.020, -0.005]",
        "x_mag": "0.012",
    }
    assert glued_values("n", 7) == {"n": 7}
    assert glued_values("v", 1.2345678) == {"v": 1.23457}
    with pytest.raises(TypeError, match="value='a'"):
        glued_values("v", "a")
    calls = []
    keep(lambda name, value, display=True: calls.append((name, value, display)), "x", d)
    assert calls == [("x", "-0.012", False), ("x_ci", "-0.012 [-0.020, -0.005]", False),
                     ("x_mag", "0.012", False)]  # fmt: skip


def test_claim_checks_the_verdict_and_flush_glues_and_prints(capsys) -> None:
    ledger = Verdicts(LOSSES, label={"rope": "RoPE", "rope+pi": "PI"}.get)
    d = ledger.diff("rope+pi", "rope", 1)
    with pytest.raises(ClaimError, match=r"pi_cost: \+0\.3000 .* is a worse, not a better"):
        ledger.claim("pi_cost", d, "better")
    assert ledger.asserted == [] and ledger.pending == {}
    with pytest.raises(ValueError, match="expected='Worse'"):
        ledger.claim("pi_cost", d, "Worse")
    ledger.claim("pi_cost", d, "worse")
    assert ledger.asserted == ["pi_cost"] and ledger.claimed["pi_cost"] is d
    with pytest.raises(ValueError, match="other"):
        ledger.flush(lambda *args, **kwargs: None, key=("other",))
    glued = {}
    ledger.flush(lambda name, value, display=True: glued.update({name: value}), key=("pi_cost",))
    assert glued == glued_values("pi_cost", d) and ledger.pending == {}
    printed = capsys.readouterr().out
    assert "worse | PI − RoPE, at 1x T" in printed and ledger.key_lines[0] in printed


def test_bad_input_names_the_argument_and_the_value() -> None:
    ledger = Verdicts(LOSSES)
    with pytest.raises(ValueError, match="arm='yarn'"):
        ledger.diff("yarn", "rope", 1)
    with pytest.raises(ValueError, match="arm='rope\\+yarn'"):
        ledger.mean("rope+yarn", 1)
    with pytest.raises(ValueError, match="m=8"):
        ledger.diff("rope", "rope+pi", 8)
    with pytest.raises(ValueError, match="m=2"):
        ledger.diff("rope", "rope", 4, 2)
    with pytest.raises(ValueError, match="counts"):
        Verdicts({"a": {1: [1.0, 2.0]}, "b": {1: [1.0, 2.0, 3.0]}})
    with pytest.raises(ValueError, match="arm='rope\\+yarn_beta_fast_5'"):
        arm_label("rope+yarn_beta_fast_5", {"fast_4": {"beta_fast": 4.0, "beta_slow": 1.0}})


def test_arm_label_writes_out_the_beta() -> None:
    betas = {
        "fast_4": {"beta_fast": 4.0, "beta_slow": 1.0},
        "rescaled": {"beta_fast": 1.0, "beta_slow": 1 / 32},
    }
    assert arm_label("rope+yarn_beta_fast_4", betas) == "YaRN (4, 1)"
    assert arm_label("rope+yarn_beta_rescaled", betas) == "YaRN (1, 1/32), both β scaled"
    assert arm_label("pi_steps_25", betas) == "PI, 400-step run at step 25"
    assert arm_label("finetune_plain", betas) == "plain fine-tuning (no scaling)"


def test_from_saved_reads_the_chapter_results_and_matches_the_summary() -> None:
    from rope_tutor.lab import load_results, load_seeds

    runs, beta_runs = load_seeds("extend_rope.json"), load_seeds("yarn_beta.json")
    more_runs, summary = load_seeds("more_methods.json"), load_results("summary.json")
    ledger = Verdicts.from_saved(runs, beta_runs, more_runs)
    seeds = list(runs)
    first = runs[seeds[0]]["inference"]["pi"]["fixed_target"]["4"]
    assert ledger.losses["rope+pi"][4][0] == first["mean"]
    book = more_runs[seeds[1]]["arms"]["rope+llama3"]["book"]["4"]
    assert ledger.losses["rope+llama3"][4][1] == round(sum(book) / len(book), 5)
    assert ledger.matches_summary(summary) > 100
    assert ledger.num_seeds == len(seeds) and ledger.multiples == [1, 2, 4, 8, 16]
    altered = {**summary, "language_model": {**summary["language_model"]}}
    altered["language_model"]["rope"] = {
        m: {**e, "per_seed": {k: v + 1 for k, v in e["per_seed"].items()}}
        for m, e in summary["language_model"]["rope"].items()
    }
    with pytest.raises(ValueError, match="arm='rope'"):
        ledger.matches_summary(altered)


def test_the_answers_table_is_one_table_of_known_verdicts() -> None:
    """Both chapter 12 pages check this one table: every verdict is one of VERDICTS, 43 in all."""
    from rope_tutor.lab.verdicts import ANSWERS_TABLE, VERDICTS

    stated = [v for entries in ANSWERS_TABLE.values() for v in entries.values()]
    assert set(stated) <= set(VERDICTS)
    assert len(ANSWERS_TABLE) == 12 and len(stated) == 43
    # the three entries the evidence page's own copy once lacked
    assert ANSWERS_TABLE["YaRN's beta, short window"]["fast4_vs_fast2_4"] == "tie"
    assert ANSWERS_TABLE["YaRN's beta, short window"]["paper_vs_fast4_4"] == "worse"
    assert ANSWERS_TABLE["longer than planned, no fine-tuning"]["pm_vs_fixed_16"] == "worse"
    with pytest.raises(TypeError):
        ANSWERS_TABLE["PI without fine-tuning"]["pi_cost"] = "tie"  # type: ignore[index]
