"""Step 2d of the lab, chapter "Extending a trained RoPE model": the arms steps 2 and 2b lack.

Part V. On the same RoPE checkpoint (``rope.safetensors``) and scored per window on the same two
samples as step 2c (``rope_tutor.lab.heldout.evaluation_samples``: the book's windows and the
held-out ones), ``more_methods`` adds:

- ``rope+llama3``: Llama 3's rule at s = ``extend_factor`` with Llama 3.1's ``low_freq_factor``
  1 and ``high_freq_factor`` 4 (Dubey et al., 2024), wavelengths measured against T;
- ``rope+temperature``: plain RoPE frequencies with YaRN's attention factor for s alone
  (0.1 ln s + 1 on cos and sin; YaRN with factor 1 and that ``attention_factor``), what the
  temperature buys without any interpolation;
- ``matched_yarn_fast4``: YaRN with beta = (4, 1) and the factor s equal to the length multiple
  it is scored at, beside step 2b's ``matched_yarn`` (the paper's beta);
- ``finetune_yarn_fast4``: step 2's short fine-tune at s T with YaRN beta = (4, 1) in place;
- ``finetune_yarn_2t``: the same fine-tune with YaRN (paper's beta, s = ``extend_factor``) on
  windows of only 2 T bytes, scored up to 16 T: "train short, test long" after extension, the
  ability to extrapolate beyond the fine-tuning data's context that Peng et al. (2023) claim
  for YaRN.

It writes ``more_methods.json``; ``summary.json`` takes each arm's mean on the book's windows.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from tqdm import tqdm

from rope_tutor.lab.data import Corpus
from rope_tutor.lab.extend import extension_methods, rope_checkpoint
from rope_tutor.lab.heldout import SAMPLES, evaluation_samples, samples_record, score_samples
from rope_tutor.lab.records import write_result
from rope_tutor.lab.settings import LabSettings
from rope_tutor.lab.short_long import language_model_batches
from rope_tutor.lab.train import fit
from rope_tutor.scaling import yarn_mscale

__all__ = ["more_inference_arms", "more_finetune_arms", "more_methods"]


def more_inference_arms(
    settings: LabSettings,
) -> list[tuple[str, dict[str, Any], list[int]]]:
    """The inference-time arms of step 2d: ``(name, rope_scaling, multiples scored)``."""
    s, window, multiples = settings.extend_factor, settings.context, list(settings.multiples)
    llama3 = {
        "rope_type": "llama3",
        "factor": s,
        "original_max_position_embeddings": window,
        "low_freq_factor": 1.0,
        "high_freq_factor": 4.0,
    }
    temperature = {
        "rope_type": "yarn",
        "factor": 1.0,  # no interpolation: every pair keeps its frequency
        "original_max_position_embeddings": window,
        "attention_factor": yarn_mscale(s),
    }
    arms = [("rope+llama3", llama3, multiples), ("rope+temperature", temperature, multiples)]
    yarn = extension_methods(settings)["yarn_paper_beta"]
    assert yarn is not None
    for m in multiples:
        if m > 1:
            arms.append(("matched_yarn_fast4", {**yarn, "factor": float(m), "beta_fast": 4.0}, [m]))
    return arms


def more_finetune_arms(settings: LabSettings) -> dict[str, tuple[dict[str, Any], int]]:
    """The fine-tuned arms of step 2d: ``{name: (rope_scaling, fine-tuning length in bytes)}``."""
    yarn = extension_methods(settings)["yarn_paper_beta"]
    assert yarn is not None
    long = int(settings.extend_factor * settings.context)
    return {
        "finetune_yarn_fast4": ({**yarn, "beta_fast": 4.0}, long),
        "finetune_yarn_2t": (yarn, 2 * settings.context),
    }


def more_methods(
    settings: LabSettings, corpus: Corpus, out_dir: Path, *, progress: bool = True
) -> dict[str, Any]:
    """Step 2d's arms scored per window on the book's and the held-out sample. Writes
    ``more_methods.json``."""
    window, multiples = settings.context, list(settings.multiples)
    windows, book_starts, held_starts = evaluation_samples(settings, corpus)
    split = len(book_starts)
    base = rope_checkpoint(settings, corpus, out_dir, progress=progress)
    arms: dict[str, Any] = {}

    def record(name: str, scaling: dict[str, Any], scores: dict[str, Any], **extra: Any) -> None:
        entry = arms.setdefault(name, {"scaling": {}, **{k: {} for k in SAMPLES}, **extra})
        for sample in SAMPLES:
            entry[sample].update(scores[sample])
        if name.startswith("matched_"):
            entry["scaling"][next(iter(scores["book"]))] = scaling
        else:
            entry["scaling"] = scaling

    for name, scaling, at in tqdm(
        more_inference_arms(settings), desc="more methods", disable=not progress
    ):
        base.set_rope_scaling(scaling)
        record(name, scaling, score_samples(base, windows, split, at, window))
    base.set_rope_scaling(None)
    for name, (scaling, length) in more_finetune_arms(settings).items():
        fitted = fit(
            base,
            language_model_batches(corpus, length),
            settings.finetune,
            scaling=scaling,
            description=name,
            progress=progress,
        )
        scores = score_samples(fitted.model, windows, split, multiples, window)
        record(name, scaling, scores, finetune_length=length)

    payload = {
        "experiment": "Llama 3, the temperature alone, YaRN beta (4, 1) matched and fine-tuned, "
        "and YaRN fine-tuned at 2T, per window on the book's and the held-out sample",
        "protocol": {
            "context": window,
            "factor": settings.extend_factor,
            "multiples": multiples,
            "fixed_target": "as in heldout.json: one loss per window and multiple",
            "finetune": f"{settings.finetune.steps} steps, batch {settings.finetune.batch_size}, "
            f"peak lr {settings.finetune.lr}, at each arm's finetune_length",
        },
        **samples_record(settings, corpus, "more-methods", book_starts, held_starts),
        "arms": arms,
    }
    write_result(out_dir / "more_methods.json", payload)
    return payload
