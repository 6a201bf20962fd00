"""Draw the landing page's figure, book/images/intro_rope_and_scaling.png, with rope_tutor.

Run once from the repository root, after changing the figure or the package:

    PYTHONPATH=$PWD .venv/bin/python book/images/make_intro_figure.py

Left: RoPE rotates a 2-D query by R(m θ) at position m (rt.rope_matrix, counter-clockwise).
Right: the wavelengths 2π/θ_i of a 128-wide head under three context-extension methods of
Part IV (rt.rope_parameters, Hugging Face's rope_scaling dicts), against the original context.
The PNG is committed, so the site needs neither this script nor a network to show it; so is its
Chinese twin, intro_rope_and_scaling.zh_CN.png, drawn with the words of rope_tutor/locale/zh_CN/.
"""

from __future__ import annotations

import base64
import math
from pathlib import Path

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402
import torch  # noqa: E402

import rope_tutor as rt  # noqa: E402
from rope_tutor import figures  # noqa: E402

OUT = Path(__file__).with_name("intro_rope_and_scaling.png")
LANGUAGE = "zh_CN"
TWIN = OUT.with_suffix(f".{LANGUAGE}.png")
HEAD_DIM, BASE, FACTOR, CONTEXT = 128, 10000.0, 4.0, 4096


def draw() -> plt.Figure:
    """The figure, in English."""
    fig, (ax_rot, ax_wave) = plt.subplots(
        1, 2, figsize=(10, 4.0), gridspec_kw={"width_ratios": [1, 1.6]}, constrained_layout=True
    )

    query = torch.tensor([1.0, 0.0], dtype=torch.float64)
    circle = torch.linspace(0, 2 * math.pi, 200)
    ax_rot.plot(circle.cos(), circle.sin(), color="0.8", linewidth=1)
    for m in range(6):
        x, y = (rt.rope_matrix(float(m), 2) @ query).tolist()  # R(m θ_0) q with θ_0 = 1 rad
        ax_rot.annotate("", xy=(x, y), xytext=(0, 0), arrowprops={"arrowstyle": "->", "lw": 1.5})
        ax_rot.text(1.18 * x, 1.18 * y, f"m = {m}", ha="center", va="center", fontsize=9)
    ax_rot.set_aspect("equal")
    ax_rot.set_xlim(-1.45, 1.45)
    ax_rot.set_ylim(-1.45, 1.45)
    ax_rot.set_xlabel("feature 1 of the pair")
    ax_rot.set_ylabel("feature 2 of the pair")
    ax_rot.set_title("RoPE turns a query pair by m·θ (θ = 1 rad)")

    methods = [  # (palette key, scaling): colours and names are the book's (rope_tutor.palette)
        ("rope", None),
        ("pi", {"rope_type": "linear", "factor": FACTOR}),
        ("ntk", {"rope_type": "ntk", "factor": FACTOR}),
        (
            "yarn",
            {"rope_type": "yarn", "factor": FACTOR, "original_max_position_embeddings": CONTEXT},
        ),
    ]
    for key, scaling in methods:
        inv_freq, _ = rt.rope_parameters(HEAD_DIM, BASE, scaling)
        style = rt.palette.style(key)
        label = f"{style['label']}, s = {FACTOR:g}" if scaling else "trained model (no scaling)"
        width = 4.0 if scaling is None else 1.6  # wide, so the methods that keep it stay visible
        ax_wave.plot(
            2 * math.pi / inv_freq.double(), color=style["color"], label=label, linewidth=width
        )
    ax_wave.axhline(CONTEXT, color="black", linestyle="--", linewidth=1)
    ax_wave.text(1, CONTEXT * 1.3, f"original context L = {CONTEXT}", fontsize=9)
    ax_wave.set_yscale("log")
    ax_wave.set_xlabel(r"pair $i$")
    ax_wave.set_ylabel(r"wavelength $2\pi/\theta_i$ (tokens)")
    ax_wave.set_title(f"Stretching the context: wavelengths, $d_h$ = {HEAD_DIM}, $b$ = {BASE:g}")
    ax_wave.legend(fontsize=8, loc="upper left")
    return fig


def main() -> None:
    fig = draw()
    fig.savefig(OUT, dpi=110)
    print(f"wrote {OUT}")
    # The Chinese edition's twin: Sphinx shows <name>.<language>.png on that edition's page
    # (figure_language_filename); its words come from rope_tutor/locale/zh_CN/ (rope_tutor.figures).
    picture, pairs = figures.translate_figure(fig, LANGUAGE, dpi=110, bbox_inches=None)
    untranslated = [english for english, translation in pairs if translation is None]
    if untranslated:
        raise SystemExit(f"no {LANGUAGE} translation of {untranslated}: see rope_tutor/figures.py")
    TWIN.write_bytes(base64.b64decode(picture))
    print(f"wrote {TWIN}")


if __name__ == "__main__":
    main()
