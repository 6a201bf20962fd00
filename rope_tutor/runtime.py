"""Device choice, seeding and plot style shared by every chapter.

A notebook starts with::

    import rope_tutor as rt
    device = rt.notebook_setup()   # fixed seed and thread count, book plot style, CUDA when present

so that it prints the same numbers on every CPU and runs unchanged on a GPU.
"""

from __future__ import annotations

import importlib.metadata
import importlib.util
import os
import platform
import random
import re
from pathlib import Path
from typing import Any

import numpy as np
import torch

from rope_tutor import _checks, figures

#: Thread count pinned by ``seed_everything``. Floating-point reductions depend on it, so the book
#: fixes it rather than taking the machine's core count (the same results everywhere). One thread:
#: the chapters' tensors are small, and on a busy machine two threads that wait for each other make
#: small operations many times slower. Long runs (the lab, the benchmark) choose their own count.
DEFAULT_THREADS = 1


def pinned_package(package: str, version: str, what: str) -> Path:
    """The folder of the installed package ``package``, checked to be exactly ``version``.

    For data read from a pinned package's own files (the lab's corpus, the real-model chapter's
    text), which are the same bytes wherever that version is installed. ``what`` names the data
    in the error messages. Raises ``ModuleNotFoundError`` when the package is not installed and
    ``RuntimeError`` when another version is (its files differ).
    """
    spec = importlib.util.find_spec(package)
    if spec is None or spec.origin is None:
        raise ModuleNotFoundError(
            f"{what} is read from {package}=={version}, which is not installed: "
            f"pip install {package}=={version}"
        )
    installed = importlib.metadata.version(package)
    if installed != version:
        raise RuntimeError(
            f"{what} is read from {package}=={version}, but {package}=={installed} is installed, "
            f"whose files differ: pip install {package}=={version}"
        )
    return Path(spec.origin).parent


def cpu_model() -> str:
    """The CPU's model name (``/proc/cpuinfo`` on Linux), for the provenance of timed runs."""
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor() or platform.machine()


def get_device() -> torch.device:
    """Return ``cuda`` when a CUDA GPU is available, else ``cpu``.

    Honours ``ROPE_TUTOR_DEVICE`` (for example ``cpu``) to force a device.
    """
    forced = os.environ.get("ROPE_TUTOR_DEVICE")
    if forced:
        return torch.device(forced)
    return torch.device("cuda" if torch.cuda.is_available() else "cpu")


def seed_everything(seed: int = 0, *, threads: int | None = DEFAULT_THREADS) -> None:
    """Seed Python, NumPy and PyTorch, pin the thread count and ask for deterministic kernels.

    ``threads=None`` leaves PyTorch's thread count alone. Raises ``ValueError`` for a negative seed
    or a thread count below 1.
    """
    seed = _checks.integer("seed", seed, minimum=0)
    if threads is not None:
        torch.set_num_threads(_checks.integer("threads", threads))
    random.seed(seed)
    np.random.seed(seed)  # noqa: NPY002  (seeds the legacy global generator readers may use)
    torch.manual_seed(seed)
    torch.use_deterministic_algorithms(True, warn_only=True)


def use_book_style() -> None:
    """Matplotlib settings used by every figure of the book.

    White backgrounds (legible on the website's light and dark themes), a modest resolution (small
    notebooks), grids and readable font sizes.
    """
    import matplotlib as mpl

    mpl.rcParams.update(
        {
            "figure.figsize": (6.4, 3.6),
            "figure.dpi": 90,
            "figure.facecolor": "white",
            "axes.facecolor": "white",
            "savefig.facecolor": "white",
            "axes.grid": True,
            "grid.alpha": 0.3,
            "axes.titlesize": 11,
            "axes.labelsize": 10,
            "legend.fontsize": 9,
            "legend.frameon": False,
            "axes.spines.top": False,
            "axes.spines.right": False,
        }
    )


#: The MIME prefix under which myst-nb stores a glued value that is not displayed in the cell.
GLUE_PREFIX = "application/papermill.record/"


def glue(name: str, variable: Any, display: bool = True) -> None:
    """Store ``variable``'s display value in the cell's output under ``name``, for the prose.

    The chapters quote computed numbers in their text through myst-nb's ``{glue:text}`` role, which
    reads what this stored. With myst-nb installed (the book's build environment) this is
    ``myst_nb.glue`` itself. Without it (a reader on Colab, where myst-nb is not shipped and
    nothing but the package is installed) it writes the same output myst-nb would: the value's
    MIME bundle, each key prefixed with ``application/papermill.record/`` unless ``display``, and
    ``metadata["scrapbook"] = {"name": name, "mime_prefix": ...}``; the tests compare the two.
    Glue a number rounded to the digits the sentence shows, never a raw float, so that the stored
    value is the same on every CPU.
    """
    if not isinstance(name, str) or not name:
        raise ValueError(f"name must be a non-empty string, got name={name!r}")
    if importlib.util.find_spec("myst_nb") is not None:
        from myst_nb import glue as myst_glue

        myst_glue(name, variable, display=display)
        return
    from IPython.core.formatters import format_display_data
    from IPython.display import display as ipython_display

    bundle, metadata = format_display_data(variable)
    prefix = "" if display else GLUE_PREFIX
    metadata["scrapbook"] = {"name": name, "mime_prefix": prefix}
    bundle = {prefix + key: value for key, value in bundle.items()}
    ipython_display(bundle, raw=True, metadata=metadata)


def notebook_setup(seed: int = 0, *, threads: int | None = DEFAULT_THREADS) -> torch.device:
    """Seed everything, pin threads, apply the book's plot style and return the device to use.

    When ``ROPE_TUTOR_FIGURE_LANGUAGES`` is set (by ``make execute`` and ``make test``, for the
    book's Chinese edition), every figure shown from then on also stores its translation
    (``rope_tutor.figures``); a reader's run leaves it unset and sees nothing of it.
    """
    seed_everything(seed, threads=threads)
    use_book_style()
    figures.register_translations()
    return get_device()


#: Matplotlib's animation player draws its buttons with Font Awesome icons loaded from a CDN; the
#: book must work offline, so each icon becomes a plain Unicode glyph (the buttons keep their
#: titles and aria-labels). Only characters that every Latin text font has, so none shows as a box.
_PLAYER_GLYPHS = {
    "fa fa-minus": "−",
    "fa fa-fast-backward": "«",
    "fa fa-step-backward": "‹",
    "fa fa-play fa-flip-horizontal": "◀",
    "fa fa-pause": "||",
    "fa fa-play": "▶",
    "fa fa-step-forward": "›",
    "fa fa-fast-forward": "»",
    "fa fa-plus": "+",
}


def animation_html(animation: Any, alt: str, **to_jshtml: Any) -> str:
    """The HTML of a matplotlib animation's player that works offline, with alt text on its frames.

    ``animation`` is a ``matplotlib.animation.Animation``; ``to_jshtml`` keywords (for example
    ``default_mode="loop"``) are passed on. Matplotlib's player links a Font Awesome stylesheet
    from a CDN for its button icons; this removes the link and draws each button as a Unicode
    glyph, so the page makes no request to another host. ``alt`` describes the animation for
    readers who cannot see it (it is set on the frame image). Raises ``ValueError`` for an empty
    ``alt`` and ``RuntimeError`` if matplotlib's player markup changed so that a remote link or an
    icon would survive.
    """
    if not isinstance(alt, str) or not alt.strip():
        raise ValueError(f"alt must describe the animation, got alt={alt!r}")
    html = animation.to_jshtml(**to_jshtml)
    html = re.sub(r"<link[^>]*font-awesome[^>]*>", "", html, flags=re.IGNORECASE)
    for icon, glyph in _PLAYER_GLYPHS.items():
        html = html.replace(f'<i class="{icon}"></i>', f'<span aria-hidden="true">{glyph}</span>')
    if re.search(r"(https?:)?//[^\s\"'<>]*\.(css|js)\b", html) or 'class="fa ' in html:
        raise RuntimeError("matplotlib's animation player changed: it still loads remote assets")
    escaped = alt.replace("&", "&amp;").replace('"', "&quot;").replace("<", "&lt;")
    return html.replace("<img id=", f'<img alt="{escaped}" id=', 1)


def show_animation(animation: Any, alt: str, *, fig: Any, **to_jshtml: Any) -> None:
    """Show :func:`animation_html`'s player in the notebook, and its translations for the book.

    ``fig`` is the figure ``animation`` draws on (the one given to ``FuncAnimation``); its words
    are the ones translated.

    With ``ROPE_TUTOR_FIGURE_LANGUAGES`` set (``make execute``), the output also stores the player
    drawn with the words of each language (``rope_tutor.figures``, as for a figure: the pairs in
    its data, the player's HTML in its metadata), which the book's edition in that language shows.
    """
    from IPython.display import display
    from matplotlib.figure import Figure

    if not isinstance(fig, Figure):
        raise TypeError(f"fig must be the Figure the animation draws on, got fig={fig!r}")
    vars(animation).pop("_html_representation", None)  # to_jshtml caches its first player
    bundle: dict[str, Any] = {  # text/plain: what a front end (or a builder) without HTML shows
        "text/html": animation_html(animation, alt, **to_jshtml),
        "text/plain": f"<animation: {alt}>",
    }
    metadata: dict[str, Any] = {}
    for language in figures.requested_languages():
        vars(animation).pop("_html_representation", None)
        with figures.translated(fig, language) as pairs:
            player = animation_html(animation, alt, **to_jshtml)
        bundle.setdefault(figures.FIGURE_MIME, {})[language] = [
            [english, pairs[english]] for english in sorted(pairs)
        ]
        metadata.setdefault(figures.FIGURE_MIME, {})[language] = {"text/html": player}
    display(bundle, raw=True, metadata=metadata)

