"""One colour and one human name per arm, for every figure of Parts IV and V.

An *arm* is a position encoding (``"rope"``, ``"alibi"``, ...) or a context-extension method
(``"pi"``, ``"yarn"``, ...), spelled as the package and the saved lab results spell it. A figure
asks ``style(key)`` for the keyword arguments of its curve, so an arm keeps its colour and its
legend name from chapter to chapter, and no code name (``yarn_paper_beta``) reaches a legend.

Colours: the eight of Okabe and Ito's colour-blind-safe palette for the arms that meet most often
(the plain RoPE baseline is black), then Paul Tol's "muted" colours and a dark grey for the rest.
The sixteen colours all differ; the one shared colour is YaRN's, between ``"yarn"`` and
``"yarn_paper_beta"`` (the same method), so any set of arms drawn together gets distinct colours.

``VERDICTS`` colours the three verdicts of a paired comparison (better, tie, worse) in grids of
verdicts: Paul Tol's "light" mint, grey and orange, light enough for black text and none of them an
arm's colour.

Keys are matched as the package writes them: Hugging Face's ``rope_type`` names (``"linear"``,
``"dynamic"``) and the lab's ``"rope+<method>"`` prefix map to the same arm as the lab's own key.
"""

from __future__ import annotations

from types import MappingProxyType

__all__ = ["ARMS", "VERDICTS", "style"]

#: Arm key -> (human name, colour). The names are what legends print.
ARMS: MappingProxyType[str, tuple[str, str]] = MappingProxyType(
    {
        # Position encodings (chapters 1 to 6, compared in "Train short, test long")
        "rope": ("RoPE", "#000000"),
        "none": ("no position encoding (NoPE)", "#999933"),
        "learned": ("learned absolute", "#CC79A7"),
        "sinusoidal": ("sinusoidal", "#56B4E9"),
        "alibi": ("ALiBi", "#009E73"),
        # Context-extension methods for RoPE (chapters 8 to 10, and the labs)
        "pi": ("PI (position interpolation)", "#E69F00"),
        "ntk": ("NTK-aware", "#0072B2"),
        "dynamic_ntk": ("dynamic NTK", "#D55E00"),
        "yarn": ("YaRN", "#882255"),
        "yarn_paper_beta": ("YaRN, paper's β (32, 1)", "#882255"),
        "yarn_rescaled_beta": ("YaRN, both β scaled to T (1, 1/32)", "#44AA99"),
        "llama3": ("Llama 3 scaling", "#332288"),
        "longrope": ("LongRoPE", "#117733"),
        # Fine-tuned arms of the labs
        "finetune_plain": ("RoPE, fine-tuned without scaling", "#666666"),
        "finetune_pi": ("PI, fine-tuned", "#CC6677"),
        "finetune_ntk": ("NTK-aware, fine-tuned", "#88CCEE"),
        "finetune_yarn": ("YaRN, fine-tuned", "#AA4499"),
    }
)

#: Verdict of a paired comparison (``rope_tutor.lab.stats.verdict``) -> colour of its grid cell.
VERDICTS: MappingProxyType[str, str] = MappingProxyType(
    {"better": "#44BB99", "tie": "#DDDDDD", "worse": "#EE8866"}
)

#: Other spellings of the same arm: Hugging Face's ``rope_type`` names and the lab's variants.
_ALIASES = {
    "nope": "none",
    "default": "rope",
    "linear": "pi",
    "dynamic": "dynamic_ntk",
    "pi_finetuned": "finetune_pi",
    "plain_finetuned": "finetune_plain",
    "ntk_finetuned": "finetune_ntk",
    "yarn_paper_beta_finetuned": "finetune_yarn",
}


def _canonical(key: str) -> str:
    if not isinstance(key, str):
        raise ValueError(f"key must be an arm name (str), got key={key!r}")
    name = key.removeprefix("rope+")
    name = _ALIASES.get(name, name)
    if name not in ARMS:
        known = ", ".join(sorted([*ARMS, *_ALIASES]))
        raise ValueError(f"unknown arm key={key!r}; known arms: {known} (optionally 'rope+<arm>')")
    return name


def style(key: str) -> dict[str, str]:
    """Matplotlib keyword arguments for the curve of one arm: ``{"color": ..., "label": ...}``.

    ``key`` is an arm as the package or the lab results spell it (``"rope"``, ``"linear"``,
    ``"rope+yarn_paper_beta"``, ...). An unknown key raises ``ValueError`` naming it.

    >>> style("rope+linear")
    {'color': '#E69F00', 'label': 'PI (position interpolation)'}
    """
    name, colour = ARMS[_canonical(key)]
    return {"color": colour, "label": name}
