"""Chapter 12's verdicts: the per-seed loss table, paired differences and the claims of the prose.

Part V, chapter "Extending a trained RoPE model" and its section "The evidence in full". Both pages
load the lab's saved results into one ``Verdicts`` object, which holds every arm's fixed-target
loss (nats/byte) at each multiple m of the training window T, one value per training seed, and
compares two arms seed by seed (``rope_tutor.lab.stats.paired_difference``: the mean of a - b
with its 95% Student-t interval). ``Verdicts.claim`` asserts the verdict a sentence states
("better": a has the lower loss; "worse"; "tie": the interval holds 0) and ``Verdicts.flush``
prints the verdicts of a cell and hands them to the prose.

The package does not glue: a method that glues takes the page's glue function
(``rope_tutor.glue``, with the signature of ``myst_nb.glue``).
"""

from __future__ import annotations

import numbers
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from types import MappingProxyType
from typing import Any, Protocol

import rope_tutor.palette as palette
from rope_tutor.lab import stats

__all__ = [
    "ANSWERS_TABLE",
    "ARM_LABELS",
    "ClaimError",
    "Glue",
    "TemperatureRule",
    "VERDICTS",
    "Verdicts",
    "arm_label",
    "digits_of",
    "glued_values",
    "keep",
    "mean_text",
]

#: The three verdicts of a paired difference of losses.
VERDICTS = ("better", "worse", "tie")
#: A verdict's mark in the tables: lower loss than the reference, higher, a tie.
MARK = MappingProxyType({"better": "↓", "worse": "↑", "tie": "="})

#: Chapter 12's "The answers in one table", row by row: for each row, the claims (by the name the
#: pages give them) and the verdict the row states. Defined once here, so that the chapter page and
#: its evidence page check the same table.
_ANSWERS: dict[str, dict[str, str]] = {
    "one rule, no fine-tuning": {
        "mf4_vs_dyn_2": "tie",
        "mfast4_vs_myarn_4": "better",
        "mfast4_vs_myarn_8": "tie",
        "mfast4_vs_myarn_16": "tie",
    },
    "no fine-tuning, up to 2T": {
        "dyn_vs_rope_2": "better",
        "dyn_vs_ntk_2": "tie",
        "ntk_cost": "worse",
    },
    "no fine-tuning, up to 4T": {"yarn_vs_ntk_4": "better", "ex_4_vs_paper": "better"},
    "Llama 3's rule, s = 4": {"llama3_vs_yarn_4": "better", "llama3_vs_fast4_4": "worse"},
    "temperature alone, s = 4": {"temp_vs_rope_4": "better", "yarn_vs_temp_4": "better"},
    "YaRN's beta, short window": {
        "resc_vs_fast4_4": "worse",
        "paper_vs_fast1_4": "tie",
        "fast4_vs_fast1_4": "tie",
        "fast4_vs_fast2_4": "tie",
        "paper_vs_fast2_4": "worse",
        "paper_vs_fast3_4": "worse",
        "paper_vs_fast4_4": "worse",
        "fast4_vs_fast3_4": "better",
    },
    "YaRN's temperature": {
        "rule_vs_best_4": "tie",
        "rule_vs_best_2": "tie",
        "rule_vs_best_8": "tie",
        "rule_vs_none_4": "better",
    },
    "PI without fine-tuning": {"pi_cost": "worse", "pi_vs_rope_4": "worse"},
    "100 steps at 4T": {
        "ft_yarn_vs_plain_4": "tie",
        "ft_ntk_vs_plain_4": "tie",
        "ft_pi_vs_plain_4": "worse",
    },
    "fine-tuning with PI": {"pi200_4_vs_rope_1": "tie", "pi400_vs_plain_4": "tie"},
    "longer than planned, no fine-tuning": {
        "ym_vs_rope_8": "better",
        "ym_vs_ntk_8": "better",
        "mfast4_vs_myarn_8": "tie",
        "mfast4_vs_myarn_16": "tie",
        "pm_vs_fixed_8": "worse",
        "pm_vs_fixed_16": "worse",
        "nm_vs_fixed_8": "worse",
    },
    "past the fine-tuning length": {
        f"ft_{arm}_past_8": "worse" for arm in ("plain", "pi", "ntk", "yarn")
    },
}
ANSWERS_TABLE: Mapping[str, Mapping[str, str]] = MappingProxyType(
    {row: MappingProxyType(entries) for row, entries in _ANSWERS.items()}
)

#: Chapter 12's name for each arm whose palette name is not enough: every YaRN arm by its
#: beta = (beta_fast, beta_slow), written out.
ARM_LABELS = MappingProxyType(
    {
        "rope+yarn_paper_beta": "YaRN (32, 1), paper's β",
        "rope+yarn_rescaled_beta": "YaRN (1, 1/32), both β scaled",
        "rope+temperature": "RoPE + YaRN's temperature (s = 4)",
        "matched_yarn": "YaRN (32, 1), s = length / T",
        "matched_yarn_fast4": "YaRN (4, 1), s = length / T",
        "finetune_plain": "plain fine-tuning (no scaling)",
        "finetune_yarn": "YaRN (32, 1), fine-tuned",
        "finetune_yarn_fast4": "YaRN (4, 1), fine-tuned",
        "finetune_yarn_2t": "YaRN (32, 1), fine-tuned at 2T",
    }
)
_BETA_NOTES = MappingProxyType({"paper": ", paper's β", "rescaled": ", both β scaled"})


class Glue(Protocol):
    """The signature of ``rope_tutor.glue`` (and ``myst_nb.glue``)."""

    def __call__(self, name: str, variable: Any, display: bool = True) -> None: ...


class ClaimError(AssertionError):
    """A verdict the prose states that the saved results do not support."""


@dataclass(frozen=True)
class TemperatureRule:
    """YaRN's temperature rule at one factor s against a sweep of the logit multiplier 1/tau.

    ``gain``: the rule minus no temperature (1/tau = 1), paired over the seeds (nats/byte);
    ``gap``: the rule minus each seed's best multiplier on the grid (picked on the same windows,
    which favours the grid); ``best``: that multiplier's grid key, per seed; ``largest_gap``: the
    largest rule-minus-best of one seed.
    """

    gain: stats.Interval
    gap: stats.Interval
    best: tuple[str, ...]
    largest_gap: float


def arm_label(arm: str, betas: Mapping[str, Mapping[str, float]]) -> str:
    """Chapter 12's human name of an arm: YaRN with its beta written out, a matched factor, a
    checkpoint of the 400-step PI run, or the palette's name.

    ``betas`` maps each arm of the YaRN beta sweep (``"fast_4"``, ``"paper"``, ...) to its scaling
    dict (with ``beta_fast`` and ``beta_slow``), as saved in ``yarn_beta.json``. Returns a string
    such as ``"YaRN (4, 1)"``.
    """
    if arm in ARM_LABELS:
        return ARM_LABELS[arm]
    if arm.startswith("rope+yarn_beta_"):
        name = arm.removeprefix("rope+yarn_beta_")
        if name not in betas:
            raise ValueError(f"arm={arm!r}: no beta arm {name!r} in betas ({sorted(betas)})")
        fast, slow = betas[name]["beta_fast"], betas[name]["beta_slow"]
        slow_text = f"1/{1 / slow:g}" if slow < 1 else f"{slow:g}"
        return f"YaRN ({fast:g}, {slow_text})" + _BETA_NOTES.get(name, "")
    if arm.startswith("pi_steps_"):
        return f"PI, 400-step run at step {arm.removeprefix('pi_steps_')}"
    if arm.startswith("matched_"):
        return palette.style(arm.removeprefix("matched_"))["label"] + ", s = length / T"
    return palette.style(arm)["label"]


def digits_of(d: stats.Interval) -> int:
    """Decimals to print an interval with: 3; 4 when it is tiny (both bounds under 0.01 in size)
    or a bound would print as a signed zero ("-0.000"); 5 when a bound would still print as one
    ("-0.0000"). A bound that is exactly 0 prints as "+0.000" and needs no more digits."""
    bounds = (d.low, d.high)
    if max(abs(d.low), abs(d.high)) >= 0.01 and not any(0 < abs(v) < 5e-4 for v in bounds):
        return 3
    return 5 if any(0 < abs(v) < 5e-5 for v in bounds) else 4


def mean_text(
    d: stats.Interval, digits: int = 3, *, max_digits: int = 5, signed: bool = True
) -> str:
    """The mean of an interval as the prose prints it: ``digits`` decimals, more when it would
    round to zero (up to ``max_digits``; ``max_digits=digits`` for a fixed number), never as a
    signed zero ("-0.000" prints "+0.000"). ``signed``: with its sign (``"+0.031"``,
    ``"-0.0004"``), else its size alone (``"0.031"``: the prose says "lower" or "higher").
    Chapters "Train short, test long" and "Extending a trained RoPE model"; nats/byte there.
    """
    if not 0 <= digits <= max_digits:
        raise ValueError(
            f"need 0 <= digits <= max_digits, got digits={digits}, max_digits={max_digits}"
        )
    while digits < max_digits and 0 < abs(d.mean) < 0.5 * 10**-digits:
        digits += 1
    text = f"{round(d.mean, digits) + 0.0:+.{digits}f}"
    return text if signed else text.lstrip("+-")


def glued_values(name: str, value: stats.Interval | float) -> dict[str, Any]:
    """What the prose reads under which name, for one number or one paired difference.

    An interval gives three names: ``name`` (``mean_text``), ``name_ci`` (the mean with its 95%
    interval, ``digits_of`` decimals, signed: the tables) and ``name_mag`` (the mean's size
    without its sign: the prose says "lower" or "higher", and asserts the sign). An ``int`` is
    kept as it is; any other number is rounded to 5 decimals (the saved results carry 5).
    """
    if isinstance(value, stats.Interval):
        return {
            name: mean_text(value),
            f"{name}_ci": value.format(digits_of(value), signed=True),
            f"{name}_mag": mean_text(value, signed=False),
        }
    if isinstance(value, bool) or not isinstance(value, numbers.Real):
        raise TypeError(f"value must be an Interval or a number, got value={value!r}")
    if isinstance(value, int):
        return {name: value}
    return {name: round(float(value), 5)}


def keep(glue: Glue, name: str, value: stats.Interval | float) -> None:
    """Glue ``glued_values(name, value)`` for the prose, each without display."""
    for key, variable in glued_values(name, value).items():
        glue(key, variable, display=False)


class Verdicts:
    """The per-seed loss table of chapter 12 and the verdicts its prose states.

    ``losses[arm][m]`` is the arm's fixed-target loss (nats/byte, the last T bytes of an input of
    m x T bytes) with one value per training seed, in the same seed order for every arm.
    ``label`` names an arm for a reader (default: the arm's key); ``multiples`` are the lengths a
    table shows by default.

    Registries (instance attributes, filled as the page runs): ``said`` (``id`` of an interval ->
    what it compares, in words), ``spec`` (``id`` -> ``(a, b, m, m_b)``, so that it can be
    re-scored on the held-out text), ``asserted`` (every claimed name, in order), ``claimed``
    (name -> interval), ``pending`` (the claims of the current cell, until ``flush``) and
    ``key_lines`` (the printed lines of the last ``flush`` that its ``key`` names).
    """

    def __init__(
        self,
        losses: Mapping[str, Mapping[int, Sequence[float]]],
        *,
        label: Callable[[str], str] = str,
        multiples: Sequence[int] | None = None,
    ) -> None:
        if not losses:
            raise ValueError("losses must hold at least one arm, got losses={}")
        self.losses: dict[str, dict[int, list[float]]] = {
            arm: {int(m): [float(v) for v in values] for m, values in by_m.items()}
            for arm, by_m in losses.items()
        }
        counts = {len(v) for by_m in self.losses.values() for v in by_m.values()}
        if len(counts) != 1 or counts == {0}:
            raise ValueError(
                f"every arm needs one loss per seed, the same seeds; got counts {counts}"
            )
        self.num_seeds = counts.pop()
        self.label = label
        self.multiples = (
            sorted({m for by_m in self.losses.values() for m in by_m})
            if multiples is None
            else [int(m) for m in multiples]
        )
        self.said: dict[int, str] = {}
        self.spec: dict[int, tuple[str, str, int, int]] = {}
        self.asserted: list[str] = []
        self.claimed: dict[str, stats.Interval] = {}
        self.pending: dict[str, stats.Interval] = {}
        self.key_lines: list[str] = []
        self._alive: list[stats.Interval] = []  # keeps every id in said and spec from reuse

    @classmethod
    def from_saved(
        cls,
        runs: Mapping[int, Mapping[str, Any]],
        beta_runs: Mapping[int, Mapping[str, Any]],
        more_runs: Mapping[int, Mapping[str, Any]],
        *,
        label: Callable[[str], str] = str,
    ) -> Verdicts:
        """The loss table from the lab's saved results, one dict per training seed (seed order):
        ``extend_rope.json`` (``runs``: the arms without fine-tuning as ``"rope"`` and
        ``"rope+<method>"``, the fine-tuned arms, the 400-step PI run as ``"pi_steps_<n>"``),
        ``yarn_beta.json`` (``"rope+yarn_beta_<name>"`` and ``"matched_<name>"``) and
        ``more_methods.json`` (its arms: the mean over the book's windows, to 5 decimals, as
        ``summary.json`` saves it)."""
        seeds = list(runs)
        if list(beta_runs) != seeds or list(more_runs) != seeds:
            raise ValueError(
                f"the three results must hold the same seeds, got {seeds}, {list(beta_runs)}, "
                f"{list(more_runs)}"
            )
        first, beta_first = runs[seeds[0]], beta_runs[seeds[0]]
        losses: dict[str, dict[int, list[float]]] = {}

        def add(arm: str, by_seed: list[Mapping]) -> None:
            losses[arm] = {
                int(m): [v[m]["mean"] if isinstance(v[m], Mapping) else v[m] for v in by_seed]
                for m in by_seed[0]
            }

        for name in first["inference"]:  # the summary's names: "rope", "rope+pi", ...
            arm = name if name == "rope" else f"rope+{name}"
            add(arm, [runs[s]["inference"][name]["fixed_target"] for s in seeds])
        for name in first["finetuned"]:
            add(name, [runs[s]["finetuned"][name]["fixed_target"] for s in seeds])
        for name in beta_first["beta"]:
            add(
                f"rope+yarn_beta_{name}",
                [beta_runs[s]["beta"][name]["fixed_target"] for s in seeds],
            )
        for name in beta_first["matched"]:
            add(f"matched_{name}", [beta_runs[s]["matched"][name] for s in seeds])
        for step in first["pi_curve"]["fixed_target"]:
            add(f"pi_steps_{step}", [runs[s]["pi_curve"]["fixed_target"][step] for s in seeds])
        for name in more_runs[seeds[0]]["arms"]:
            book = [more_runs[s]["arms"][name]["book"] for s in seeds]
            add(name, [{m: round(sum(v) / len(v), 5) for m, v in b.items()} for b in book])
        return cls(losses, label=label, multiples=first["protocol"]["multiples"])

    def matches_summary(self, summary: Mapping[str, Any]) -> int:
        """How many (arm, length) entries of ``summary.json`` this table holds, each checked equal
        to the summary's per-seed values; raises ``ValueError`` naming the first that differs."""
        seeds = [str(s) for s in summary["seeds"]]
        checked = 0
        for arm, by_multiple in summary["language_model"].items():
            for m, entry in by_multiple.items():
                if arm in self.losses:
                    saved = [entry["per_seed"][s] for s in seeds]
                    if saved != self.losses[arm][int(m)]:
                        raise ValueError(
                            f"arm={arm!r}, m={m}: {self.losses[arm][int(m)]} != {saved}"
                        )
                    checked += 1
        return checked

    def _values(self, arm: str, m: int) -> list[float]:
        if arm not in self.losses:
            raise ValueError(f"unknown arm={arm!r}; the table holds {len(self.losses)} arms")
        if m not in self.losses[arm]:
            raise ValueError(f"arm {arm!r} has no m={m!r}; it has {sorted(self.losses[arm])}")
        return self.losses[arm][m]

    def mean(self, arm: str, m: int) -> stats.Interval:
        """The arm's mean loss (nats/byte) at m x T over the seeds, with its 95% t interval."""
        return stats.mean_interval(self._values(arm, m))

    def diff(self, a: str, b: str, m: int, m_b: int | None = None) -> stats.Interval:
        """Arm ``a`` at m x T minus arm ``b`` at m_b x T (default m), paired seed by seed: the
        mean difference (nats/byte) with its 95% Student-t interval; recorded in ``said`` and
        ``spec``."""
        m_b = m if m_b is None else m_b
        d = stats.paired_difference(self._values(a, m), self._values(b, m_b))
        if a == b:
            words = f"{self.label(a)}: at {m}x T − at {m_b}x T"
        elif m == m_b:
            words = f"{self.label(a)} − {self.label(b)}, at {m}x T"
        else:
            words = f"{self.label(a)} at {m}x T − {self.label(b)} at {m_b}x T"
        self.note(d, words, (a, b, m, m_b))
        return d

    def note(
        self, d: stats.Interval, said: str, spec: tuple[str, str, int, int] | None = None
    ) -> None:
        """Record what an interval made outside ``diff`` compares (``said``) and, when it can be
        re-scored on the held-out text, its ``(a, b, m, m_b)`` under the held-out step's names."""
        self._alive.append(d)
        self.said[id(d)] = said
        if spec is not None:
            self.spec[id(d)] = spec

    def temperature_rule(self, s: float, sweep: Mapping[str, Sequence[float]]) -> TemperatureRule:
        """Chapter 12's temperature sweep at factor ``s``, scored at s x T: ``sweep`` maps each
        grid multiplier (``"1.0"``, ``"1.1"``, ...) and ``"yarn_formula"`` (YaRN's rule,
        sqrt(1/tau) = 0.1 ln s + 1) to its loss per seed. Records what ``gain`` and ``gap``
        compare (``note``), ``gain`` with its held-out names ``temperature_<s>_yarn_formula``
        and ``temperature_<s>_1.0``."""
        if "yarn_formula" not in sweep or "1.0" not in sweep:
            raise ValueError(f"sweep needs 'yarn_formula' and '1.0', got keys {sorted(sweep)}")
        rule = list(sweep["yarn_formula"])
        grid = [k for k in sweep if k != "yarn_formula"]
        best = [min(grid, key=lambda k, i=i: sweep[k][i]) for i in range(len(rule))]
        best_losses = [sweep[k][i] for i, k in enumerate(best)]
        gain = stats.paired_difference(rule, sweep["1.0"])
        gap = stats.paired_difference(rule, best_losses)  # > 0: the grid's best beats the rule
        at = f"s = {s:g} at {s:g}x T"
        held = (
            f"temperature_{float(s)}_yarn_formula",
            f"temperature_{float(s)}_1.0",
            int(s),
            int(s),
        )
        self.note(gain, f"YaRN's rule − no temperature (1/τ = 1), {at}", held)
        self.note(gap, f"YaRN's rule − the grid's best 1/τ, {at}")
        largest = max(r - b for r, b in zip(rule, best_losses, strict=True))
        return TemperatureRule(gain, gap, tuple(best), largest)

    @staticmethod
    def verdict(d: stats.Interval) -> str:
        """``"better"`` (a has the lower loss), ``"worse"``, or ``"tie"`` (the interval holds 0)."""
        return stats.verdict(d, lower_is_better=True)

    def claim(self, name: str, d: stats.Interval, expected: str) -> None:
        """Record the verdict the prose states under ``name`` and check it: raises ``ClaimError``
        (an ``AssertionError``) when ``d``'s verdict is another, ``ValueError`` when ``expected``
        is not one of ``VERDICTS``."""
        if expected not in VERDICTS:
            raise ValueError(f"expected must be one of {VERDICTS}, got expected={expected!r}")
        found = self.verdict(d)
        if found != expected:
            raise ClaimError(f"{name}: {d.format(4, signed=True)} is a {found}, not a {expected}")
        self.asserted.append(name)
        self.claimed[name] = d
        self.pending[name] = d

    def flush(self, glue: Glue, key: Sequence[str] = ()) -> None:
        """Print the verdicts claimed since the last flush in one block (a folded output), glue
        each with ``keep`` and keep the lines named in ``key`` in ``key_lines``; raises
        ``ValueError`` for a key that was not claimed since the last flush."""
        missing = [n for n in key if n not in self.pending]
        if missing:
            raise ValueError(f"key names verdicts this cell does not claim: {missing}")
        line = {
            n: f"{d.format(digits_of(d), signed=True):>30} {self.verdict(d):>6} | "
            f"{self.said.get(id(d), n)}"
            for n, d in self.pending.items()
        }
        print(
            "verdicts the prose states (a − b in nats/byte, paired over the seeds; "
            "'better': a has the lower loss)"
        )
        print("\n".join(line.values()))
        self.key_lines = [line[n] for n in key]
        for name, d in self.pending.items():
            keep(glue, name, d)
        self.pending.clear()

    def table(self, arms: Sequence[str], title: str, lengths: Sequence[int] | None = None) -> None:
        """Print each arm's mean loss over the seeds ± the half-width of its 95% interval
        (nats/byte) at each multiple of T in ``lengths`` (default: ``multiples``)."""
        lengths = self.multiples if lengths is None else lengths
        width = max(len(self.label(a)) for a in arms) + 2
        print(f"{title} (nats/byte, mean ± 95% interval over {self.num_seeds} seeds)")
        print(f"{'arm':>{width}} | " + " | ".join(f"{f'{m}x T':^13}" for m in lengths))
        for arm in arms:
            cells = [self.mean(arm, m) for m in lengths]
            print(
                f"{self.label(arm):>{width}} | "
                + " | ".join(f"{c.mean:.3f} ± {c.high - c.mean:.3f}" for c in cells)
            )

    def diff_table(
        self, arms: Sequence[str], reference: str, lengths: Sequence[int] | None = None
    ) -> None:
        """Print each arm minus ``reference``, paired by seed, at each multiple of T: mean ±
        half-width (nats/byte) and the verdict (↓ lower loss than the reference, ↑ higher,
        = tie: the interval holds 0)."""
        lengths = self.multiples if lengths is None else lengths
        width = max(len(self.label(a)) for a in arms) + 2
        print(
            f"minus {self.label(reference)} (nats/byte, paired over {self.num_seeds} seeds; "
            "↓ lower, ↑ higher, = tie)"
        )
        print(f"{'arm':>{width}} | " + " | ".join(f"{f'{m}x T':^16}" for m in lengths))
        for arm in arms:
            cells = [self.diff(arm, reference, m) for m in lengths]
            print(
                f"{self.label(arm):>{width}} | "
                + " | ".join(
                    f"{c.mean:+.3f} ± {c.high - c.mean:.3f} {MARK[self.verdict(c)]}" for c in cells
                )
            )
