"""Step 2 of the lab, chapter "Extending a trained RoPE model".

Part V. ``extend_rope`` takes the RoPE arm of step 1 (``rope.safetensors``, trained by
``rope_tutor.lab.short_long`` when absent) and measures, on the windows of step 1:

- the inference-time methods of ``extension_methods`` (PI, NTK-aware, dynamic NTK, YaRN, as
  the ``rope_scaling`` dicts that ``rope_tutor.scaling`` reads) at every multiple of T;
- the attention-temperature sweep of YaRN: logit multipliers around YaRN's own (0.1 ln s + 1)^2;
- short fine-tunes at ``extend_factor * T``: plain RoPE, PI, NTK-aware and YaRN;
- a longer PI fine-tune scored after each of ``pi_curve_steps`` steps (loss against steps, in the
  manner of Table 3 of Chen et al., 2023).

It writes ``extend_rope.json``. ``rope_tutor.lab.yarn_beta`` adds YaRN's beta arms and the
length-matched factors (``yarn_beta.json``) on the same checkpoint.
"""

from __future__ import annotations

import math
from dataclasses import replace
from pathlib import Path
from typing import Any

import torch

from rope_tutor.lab.data import Corpus, fixed_target_windows
from rope_tutor.lab.evaluate import fixed_target_losses
from rope_tutor.lab.model import TinyLM, load_checkpoint, save_checkpoint
from rope_tutor.lab.records import provenance, rounded, write_result
from rope_tutor.lab.settings import LabSettings
from rope_tutor.lab.short_long import (
    evaluate_language_model,
    language_model_batches,
    train_language_model,
)
from rope_tutor.lab.train import TrainConfig, fit

__all__ = [
    "extend_rope",
    "extension_methods",
    "finetune_arms",
    "pi_curve_config",
    "rope_checkpoint",
]


def extension_methods(settings: LabSettings) -> dict[str, dict[str, Any] | None]:
    """The inference-time methods of step 2 as Hugging Face style ``rope_scaling`` dicts.

    Static methods use ONE factor s = ``extend_factor`` at every length, so that their cost at
    short lengths shows. Dynamic NTK recomputes s = max(1, l / T) from the length l it sees
    (``factor`` 1 is emozilla's alpha = 1). YaRN runs with the paper's beta (32, 1), tuned for
    LLaMA's 2k-4k windows, and with both betas rescaled by T / 4096 (1, 1/32): beta counts turns
    of a pair inside the window, and a window 32x shorter holds 32x fewer turns. Rescaling
    beta_slow as well leaves the pairs that turn between 1/32 and 1 times only partly
    interpolated, so they meet unseen angles past T; ``rope_tutor.lab.yarn_beta`` measures this
    arm beside beta_fast alone rescaled (beta_slow = 1), chapter "Extending a trained RoPE model".
    """
    s, window = settings.extend_factor, settings.context
    yarn = {"rope_type": "yarn", "factor": s, "original_max_position_embeddings": window}
    return {
        "rope": None,
        "pi": {"rope_type": "linear", "factor": s},
        "ntk": {"rope_type": "ntk", "factor": s},
        "dynamic_ntk": {
            "rope_type": "dynamic",
            "factor": 1.0,
            "original_max_position_embeddings": window,
        },
        "yarn_paper_beta": {**yarn, "beta_fast": 32.0, "beta_slow": 1.0},
        "yarn_rescaled_beta": {**yarn, **_rescaled_beta(window)},
    }


def _rescaled_beta(window: int) -> dict[str, float]:
    return {"beta_fast": 32.0 * window / 4096, "beta_slow": 1.0 * window / 4096}


def rope_checkpoint(
    settings: LabSettings, corpus: Corpus, out_dir: Path, *, progress: bool
) -> TinyLM:
    """The RoPE arm of step 1: loaded from its checkpoint, or trained (and saved) when absent."""
    path = out_dir / "rope.safetensors"
    if path.exists():
        return load_checkpoint(path)
    model = train_language_model("rope", settings, corpus, progress=progress).model
    save_checkpoint(model, path)
    return model


def _inference(
    model: TinyLM, methods: dict[str, dict[str, Any] | None], settings: LabSettings, corpus: Corpus
) -> tuple[dict[str, Any], dict[str, bool]]:
    """Every method swapped into ``model`` at inference, and the sanity check that PI with
    factor 1 is plain RoPE, bit for bit."""
    inference = {}
    for name, scaling in methods.items():
        model.set_rope_scaling(scaling)
        inference[name] = {"scaling": scaling}
        inference[name].update(evaluate_language_model(model, settings, corpus, chunked=False))
    model.set_rope_scaling({"rope_type": "linear", "factor": 1.0})
    pi_one = evaluate_language_model(model, settings, corpus, chunked=False)
    sanity = {
        "pi_factor_1_equals_rope": pi_one["fixed_target"] == inference["rope"]["fixed_target"]
    }
    return inference, sanity


def _temperature(
    model: TinyLM, yarn: dict[str, Any], settings: LabSettings, corpus: Corpus
) -> dict[str, Any]:
    """Attention temperature: YaRN (paper's beta) at each factor s, scored on the same windows
    and targets as step 1 with s * T bytes of input, the logit multiplier 1/t swept (cos and sin
    are multiplied by its square root), and once with YaRN's own 0.1 ln s + 1."""
    windows = fixed_target_windows(
        corpus.validation,
        settings.eval_windows,
        settings.multiples[-1] * settings.context,
        settings.eval_seed,
    )
    temperature = {}
    for s in settings.temperature_factors:
        length = int(s * settings.context)
        at_s = {**yarn, "factor": s}
        sweep = {}
        for multiplier in (*settings.logit_multipliers, None):
            extra = {} if multiplier is None else {"attention_factor": math.sqrt(multiplier)}
            model.set_rope_scaling({**at_s, **extra})
            mean, _ = fixed_target_losses(model, windows, [length], settings.context)[length]
            sweep["yarn_formula" if multiplier is None else str(multiplier)] = rounded(mean)
        temperature[str(s)] = {
            "sweep": sweep,
            "yarn_formula_multiplier": rounded((0.1 * math.log(s) + 1) ** 2, 4),
        }
    model.set_rope_scaling(None)
    return temperature


def finetune_arms(
    methods: dict[str, dict[str, Any] | None],
) -> dict[str, dict[str, Any] | None]:
    """The fine-tuning arms of step 2 and the scaling each trains with, from ``methods``
    (``extension_methods``): plain RoPE, PI, NTK-aware and YaRN with the paper's beta."""
    return {
        "finetune_plain": None,
        "finetune_pi": methods["pi"],
        "finetune_ntk": methods["ntk"],
        "finetune_yarn": methods["yarn_paper_beta"],
    }


def pi_curve_config(settings: LabSettings) -> TrainConfig:
    """The longer PI fine-tune of step 2: ``settings.finetune`` run for ``max(pi_curve_steps)``
    steps (batch, peak rate, warm-up; cosine decay over the whole run)."""
    return replace(settings.finetune, steps=max(settings.pi_curve_steps))


def _finetuned(
    model: TinyLM,
    methods: dict[str, dict[str, Any] | None],
    settings: LabSettings,
    corpus: Corpus,
    *,
    progress: bool,
) -> dict[str, Any]:
    """Copies of ``model`` fine-tuned at ``extend_factor * T`` (``settings.finetune``) with
    plain RoPE, PI, NTK-aware and YaRN (paper's beta) in place, each evaluated as in step 1."""
    length = int(settings.extend_factor * settings.context)
    finetuned = {}
    for name, scaling in finetune_arms(methods).items():
        fitted = fit(
            model,
            language_model_batches(corpus, length),
            settings.finetune,
            scaling=scaling,
            description=name,
            progress=progress,
        )
        finetuned[name] = {"scaling": scaling, "train_seconds": round(fitted.seconds, 1)}
        finetuned[name].update(
            evaluate_language_model(fitted.model, settings, corpus, chunked=False)
        )
    return finetuned


def _pi_curve(
    model: TinyLM, settings: LabSettings, corpus: Corpus, *, progress: bool
) -> dict[str, Any]:
    """A copy of ``model`` fine-tuned with PI at ``extend_factor * T`` for
    ``max(pi_curve_steps)`` steps (``settings.finetune`` otherwise: batch, peak rate, warm-up,
    cosine decay over the whole run), its fixed-target loss scored at every multiple after each
    of ``pi_curve_steps`` steps. One run, evaluated along the way, as in PI's Table 3."""
    length = int(settings.extend_factor * settings.context)
    config = pi_curve_config(settings)
    windows = fixed_target_windows(
        corpus.validation,
        settings.eval_windows,
        settings.multiples[-1] * settings.context,
        settings.eval_seed,
    )
    contexts = [m * settings.context for m in settings.multiples]
    curve: dict[str, Any] = {}

    def checkpoint(steps_done: int, tuned: torch.nn.Module) -> None:
        if steps_done in settings.pi_curve_steps:
            losses = fixed_target_losses(tuned, windows, contexts, settings.context)
            curve[str(steps_done)] = {
                str(c // settings.context): rounded(mean) for c, (mean, _) in losses.items()
            }

    fitted = fit(
        model,
        language_model_batches(corpus, length),
        config,
        scaling=extension_methods(settings)["pi"],
        description="pi-curve",
        progress=progress,
        checkpoint=checkpoint,
    )
    return {
        "finetune": config.to_dict(),
        "train_seconds": round(fitted.seconds, 1),
        "fixed_target": curve,
    }


def extend_rope(
    settings: LabSettings, corpus: Corpus, out_dir: Path, *, progress: bool = True
) -> dict[str, Any]:
    """Context extension of the step-1 RoPE model. Writes ``extend_rope.json``."""
    base_model = rope_checkpoint(settings, corpus, out_dir, progress=progress)
    methods = extension_methods(settings)
    inference, sanity = _inference(base_model, methods, settings, corpus)
    temperature = _temperature(base_model, methods["yarn_paper_beta"], settings, corpus)
    finetuned = _finetuned(base_model, methods, settings, corpus, progress=progress)
    pi_curve = _pi_curve(base_model, settings, corpus, progress=progress)
    s = settings.extend_factor
    payload = {
        "experiment": "extending a trained RoPE model",
        "protocol": {
            "context": settings.context,
            "factor": s,
            "multiples": list(settings.multiples),
            "fixed_target": "as in train_short_test_long.json (same windows)",
            "finetune": f"{settings.finetune.steps} steps at {int(s * settings.context)} bytes, "
            f"batch {settings.finetune.batch_size}, peak lr {settings.finetune.lr}",
            "pi_curve": f"PI fine-tuned {max(settings.pi_curve_steps)} steps at "
            f"{int(s * settings.context)} bytes (cosine over the whole run), fixed-target loss "
            f"after {list(settings.pi_curve_steps)} steps",
        },
        "provenance": provenance(
            settings,
            corpus,
            "extend",
            seed=settings.pretrain.seed,
            steps=settings.pretrain.steps,
            finetune=settings.finetune.to_dict(),
        ),
        "sanity": sanity,
        "inference": inference,
        "temperature": temperature,
        "finetuned": finetuned,
        "pi_curve": pi_curve,
    }
    write_result(out_dir / "extend_rope.json", payload)
    return payload
