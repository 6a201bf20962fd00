"""Tests of the lab's YaRN beta and matched-factor experiment (rope_tutor.lab.yarn_beta).

The saved ``yarn_beta.json`` is checked three ways: against the numbers of ``extend_rope.json``
that a different code path measured on the same checkpoint and windows, against properties of
the methods (dynamic NTK at l = s T is static NTK with factor s), and by re-computing a few of
its numbers from the saved checkpoint with scaling dictionaries written out here.
"""

from __future__ import annotations

import hashlib
import json
import math

import pytest
import torch

import rope_tutor as rt
from rope_tutor.lab.data import fixed_target_windows, load_corpus
from rope_tutor.lab.evaluate import fixed_target_losses
from rope_tutor.lab.model import load_checkpoint
from rope_tutor.lab.settings import BOOK
from rope_tutor.lab.yarn_beta import matched_scaling
from rope_tutor.results import RESULTS_DIR

#: Seed 0 of the saved lab (every seed runs the same code on its own checkpoint).
DATA = RESULTS_DIR / "lab" / "seed_0"
SAVED = json.loads((DATA / "yarn_beta.json").read_text())
EXTEND = json.loads((DATA / "extend_rope.json").read_text())
#: Re-running inference on the same checkpoint: bitwise equal on the machine and thread count of
#: the provenance; another CPU changes the last bits of reductions, far below a thousandth.
TOLERANCE = 1e-3


def test_saved_file_carries_provenance_and_names_its_checkpoint() -> None:
    record = SAVED["provenance"]
    for key in ("rope_tutor", "torch", "threads", "train_sha256", "seed", "steps"):
        assert key in record
    assert record["command"] == "python -m rope_tutor.lab yarn-beta"
    assert record["train_sha256"] == EXTEND["provenance"]["train_sha256"]
    checkpoint = (DATA / record["checkpoint"]).read_bytes()
    assert record["checkpoint_sha256"] == hashlib.sha256(checkpoint).hexdigest()
    assert SAVED["protocol"]["inference_only"] is True


def _seed(seed: int) -> tuple[dict, dict]:
    folder = RESULTS_DIR / "lab" / f"seed_{seed}"
    return (
        json.loads((folder / "yarn_beta.json").read_text()),
        json.loads((folder / "extend_rope.json").read_text()),
    )


@pytest.mark.parametrize("seed", BOOK.seeds)
def test_arms_shared_with_extend_rope_agree_with_it(seed: int) -> None:
    saved, extend = _seed(seed)
    # Step 2 measured the paper's and the rescaled beta at every multiple, and YaRN (paper's
    # beta, its own temperature) at s T for s = 2, 4, 8 in its temperature sweep.
    inference = extend["inference"]
    for ours, theirs in (("paper", "yarn_paper_beta"), ("rescaled", "yarn_rescaled_beta")):
        assert saved["beta"][ours]["scaling"] == inference[theirs]["scaling"]
        for m, value in inference[theirs]["fixed_target"].items():
            assert saved["beta"][ours]["fixed_target"][m]["mean"] == pytest.approx(
                value["mean"], abs=1e-4
            )
    for s, entry in extend["temperature"].items():
        matched = saved["matched"]["yarn"][f"{float(s):g}"]["mean"]
        assert matched == pytest.approx(entry["sweep"]["yarn_formula"], abs=1e-4)
    for method in ("pi", "ntk"):  # the static arms of step 2 use s = 4
        assert saved["matched"][method]["4"]["mean"] == pytest.approx(
            inference[method]["fixed_target"]["4"]["mean"], abs=1e-4
        )


@pytest.mark.parametrize("seed", BOOK.seeds)
def test_matched_ntk_is_dynamic_ntk_at_its_own_length(seed: int) -> None:
    saved, extend = _seed(seed)
    # Dynamic NTK computes s = l / T from the length l, so at l = s T it is static NTK with s.
    dynamic = extend["inference"]["dynamic_ntk"]["fixed_target"]
    for s, entry in saved["matched"]["ntk"].items():
        assert entry["mean"] == pytest.approx(dynamic[s]["mean"], abs=1e-4)


def test_beta_fast_one_keeps_the_pairs_that_turn_and_interpolates_the_rest() -> None:
    # Independent of the ramp code: with beta = (1, 1) every pair that completes a turn inside T
    # keeps its frequency, every other pair is divided by s (NTK-by-parts without a blend).
    head_dim, window, s = 32, BOOK.context, BOOK.extend_factor
    scaling = SAVED["beta"]["fast_1"]["scaling"]
    assert (scaling["beta_fast"], scaling["beta_slow"], scaling["factor"]) == (1.0, 1.0, s)
    inv_freq, _ = rt.rope_parameters(head_dim, 10000.0, scaling)
    theta = 10000.0 ** (-torch.arange(0, head_dim, 2, dtype=torch.float64) / head_dim)
    turns = window * theta / (2 * math.pi)
    expected = torch.where(turns >= 1, theta, theta / s)
    assert torch.allclose(inv_freq.double(), expected, rtol=1e-6, atol=0)


def test_matched_scaling_refuses_an_unknown_method() -> None:
    assert matched_scaling("pi", 8, 128) == {"rope_type": "linear", "factor": 8.0}
    with pytest.raises(ValueError, match="method='alibi'"):
        matched_scaling("alibi", 8, 128)


#: (group, arm, multiple, rope_scaling written out by hand) re-computed from the checkpoint.
RECOMPUTED = [
    ("beta", "fast_4", "1", {"beta_fast": 4.0, "beta_slow": 1.0, "factor": 4.0}),
    ("beta", "fast_4", "4", {"beta_fast": 4.0, "beta_slow": 1.0, "factor": 4.0}),
    ("beta", "rescaled", "4", {"beta_fast": 1.0, "beta_slow": 1 / 32, "factor": 4.0}),
    ("matched", "yarn", "16", {"beta_fast": 32.0, "beta_slow": 1.0, "factor": 16.0}),
]


def test_saved_numbers_are_recomputed_from_the_checkpoint() -> None:
    corpus = load_corpus(BOOK.train_bytes, BOOK.validation_bytes)  # the pinned sympy
    assert corpus.train_sha256 == SAVED["provenance"]["train_sha256"]
    model = load_checkpoint(DATA / "rope.safetensors")
    window = BOOK.context
    windows = fixed_target_windows(
        corpus.validation, BOOK.eval_windows, BOOK.multiples[-1] * window, BOOK.eval_seed
    )
    for group, arm, multiple, extra in RECOMPUTED:
        model.set_rope_scaling(
            {"rope_type": "yarn", "original_max_position_embeddings": window, **extra}
        )
        length = int(multiple) * window
        mean, _ = fixed_target_losses(model, windows, [length], window)[length]
        entry = SAVED[group][arm]
        saved = entry["fixed_target"][multiple] if group == "beta" else entry[multiple]
        assert mean == pytest.approx(saved["mean"], abs=TOLERANCE), (group, arm, multiple)
