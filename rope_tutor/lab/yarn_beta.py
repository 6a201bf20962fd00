"""Step 2b of the lab, chapter "Extending a trained RoPE model": YaRN's beta, and matched factors.

Part V. Inference only, on the RoPE checkpoint of step 1 (``rope.safetensors``; trained by
``rope_tutor.lab.short_long`` when absent), scored with the fixed-target protocol of step 1 on the
same windows (``rope_tutor.lab.evaluate.fixed_target_losses``):

- ``beta``: YaRN at ``extend_factor`` with the paper's beta (32, 1), with both betas rescaled by
  T / 4096 (step 2's "rescaled" arm), and with ``beta_fast`` in ``BETA_FAST`` while
  ``beta_slow`` stays 1, at every multiple of T;
- ``matched``: PI, static NTK-aware and YaRN (paper's beta) with the factor s equal to the length
  multiple they are scored at (s T at s = 2, 4, ...).

It writes ``yarn_beta.json``. Peng et al., YaRN (2023), for beta and the ramp; equations
(yarn-ramp) and (yarn-correction-dim) in "Beyond: NTK-by-parts and YaRN".
"""

from __future__ import annotations

import hashlib
from pathlib import Path
from typing import Any

from tqdm import tqdm

from rope_tutor.lab.data import Corpus, fixed_target_windows
from rope_tutor.lab.evaluate import fixed_target_losses
from rope_tutor.lab.extend import extension_methods, rope_checkpoint
from rope_tutor.lab.records import provenance, rounded, write_result
from rope_tutor.lab.settings import LabSettings

__all__ = ["BETA_FAST", "MATCHED_METHODS", "beta_arms", "matched_scaling", "yarn_beta"]

#: The beta_fast values tried with beta_slow = 1 (turns of a pair inside the window T).
BETA_FAST: tuple[float, ...] = (1.0, 2.0, 3.0, 4.0, 8.0, 16.0)

#: Methods scored with the factor matched to the length: lab key -> Hugging Face ``rope_type``.
MATCHED_METHODS: dict[str, str] = {"pi": "linear", "ntk": "ntk", "yarn": "yarn"}


def beta_arms(settings: LabSettings) -> dict[str, dict[str, Any]]:
    """YaRN at ``settings.extend_factor`` with each beta of the experiment, as ``rope_scaling``.

    ``"paper"`` is (32, 1) and ``"rescaled"`` is step 2's (32, 1) * T / 4096, both taken from
    ``extension_methods``; ``"fast_<b>"`` is (b, 1) for b in ``BETA_FAST``.
    """
    methods = extension_methods(settings)
    arms = {"paper": methods["yarn_paper_beta"], "rescaled": methods["yarn_rescaled_beta"]}
    for beta_fast in BETA_FAST:
        arms[f"fast_{beta_fast:g}"] = {**methods["yarn_paper_beta"], "beta_fast": beta_fast}
    return arms


def matched_scaling(method: str, factor: float, window: int) -> dict[str, Any]:
    """``rope_scaling`` of ``method`` (a key of ``MATCHED_METHODS``) with factor ``factor``.

    YaRN uses the paper's beta (32, 1) and its own attention factor 0.1 ln s + 1. Raises
    ``ValueError`` naming ``method`` if it is not one of ``MATCHED_METHODS``.
    """
    if method not in MATCHED_METHODS:
        raise ValueError(f"method must be one of {sorted(MATCHED_METHODS)}, got method={method!r}")
    scaling: dict[str, Any] = {"rope_type": MATCHED_METHODS[method], "factor": float(factor)}
    if method == "yarn":
        scaling.update(original_max_position_embeddings=window, beta_fast=32.0, beta_slow=1.0)
    return scaling


def _sha256(path: Path) -> str:
    return hashlib.sha256(path.read_bytes()).hexdigest()


def yarn_beta(
    settings: LabSettings, corpus: Corpus, out_dir: Path, *, progress: bool = True
) -> dict[str, Any]:
    """YaRN's beta arms and the matched-factor arms of step 2b. Writes ``yarn_beta.json``."""
    model = rope_checkpoint(settings, corpus, out_dir, progress=progress)
    window = settings.context
    contexts = [m * window for m in settings.multiples]
    windows = fixed_target_windows(
        corpus.validation, settings.eval_windows, contexts[-1], settings.eval_seed
    )
    arms = beta_arms(settings)
    matched_multiples = [m for m in settings.multiples if m > 1]
    jobs: list[tuple[str, str, dict[str, Any], list[int]]] = [
        ("beta", name, scaling, contexts) for name, scaling in arms.items()
    ]
    for method in MATCHED_METHODS:
        for m in matched_multiples:
            jobs.append((method, str(m), matched_scaling(method, m, window), [m * window]))

    beta: dict[str, Any] = {}
    matched: dict[str, Any] = {method: {} for method in MATCHED_METHODS}
    for group, name, scaling, lengths in tqdm(
        jobs, desc="yarn-beta", disable=not progress, mininterval=2.0
    ):
        model.set_rope_scaling(scaling)
        losses = fixed_target_losses(model, windows, lengths, window)
        scores = {
            str(length // window): {"mean": rounded(mean), "stderr": rounded(error)}
            for length, (mean, error) in losses.items()
        }
        if group == "beta":
            beta[name] = {"scaling": scaling, "fixed_target": scores}
        else:
            matched[group][name] = {"scaling": scaling, **scores[name]}
    model.set_rope_scaling(None)

    payload = {
        "experiment": "YaRN's beta and length-matched factors on the trained RoPE model",
        "protocol": {
            "context": window,
            "factor": settings.extend_factor,
            "multiples": list(settings.multiples),
            "fixed_target": "as in train_short_test_long.json (same windows)",
            "beta": f"YaRN at s = {settings.extend_factor:g}; (beta_fast, beta_slow) per arm",
            "matched": "factor s = the length multiple, scored at s T",
            "inference_only": True,
        },
        "provenance": provenance(
            settings,
            corpus,
            "yarn-beta",
            seed=settings.pretrain.seed,
            steps=settings.pretrain.steps,
            checkpoint="rope.safetensors",
            checkpoint_sha256=_sha256(out_dir / "rope.safetensors"),
        ),
        "beta": beta,
        "matched": matched,
    }
    write_result(out_dir / "yarn_beta.json", payload)
    return payload
