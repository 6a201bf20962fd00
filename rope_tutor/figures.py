"""Each figure of the book in its other language: the same figure, its words from a catalogue.

A chapter draws each figure once, in English, and shows it with ``plt.show()``. When the
environment variable ``ROPE_TUTOR_FIGURE_LANGUAGES`` names a language (``zh_CN``; ``make execute``
and ``make test`` set it, a reader's notebook never needs it),
:func:`~rope_tutor.runtime.notebook_setup` calls :func:`register_translations`. From then on,
every figure a cell shows is drawn a second time, with

- every word it shows (titles, axis titles, legends, annotations, worded tick labels) replaced by
  its translation from the catalogue ``rope_tutor/locale/<language>/*.po``, whose ``msgid`` is
  the exact English text as the figure shows it (``$...$`` math included);
- a font with the language's glyphs (for ``zh_CN``, Noto Sans CJK SC: Debian's
  ``fonts-noto-cjk``, which ``make browser`` installs); a glyph missing from it is an error.

The output of ``plt.show()`` then carries, beside the English ``image/png``, one more entry,
:data:`FIGURE_MIME`: in its data, the pairs (English text, translation) the figure shows, which
strict nbval compares like any text; in its metadata, the translated picture (``image/png``,
base64), which neither a notebook front end nor nbval looks at. The book's Chinese edition shows
that picture in place of the English one (``book/_ext/languages.py``); the English edition drops
the entry. A text without a translation is recorded with ``None`` and stays English in the
picture; ``tests/test_figure_words.py`` fails on it, and ``python -m rope_tutor.figures`` adds it
to the catalogue for a translator.

A word needs no translation when it is a name (:data:`KEPT_WORDS`: methods, models, units),
a single letter (a symbol such as ``L``, ``T`` or ``s``) or inside ``$...$``.
"""

from __future__ import annotations

import functools
import os
import re
import warnings
from collections.abc import Iterator
from contextlib import contextmanager
from importlib.resources import files
from pathlib import Path
from typing import Any

__all__ = [
    "FIGURE_MIME",
    "FONTS",
    "KEPT_WORDS",
    "LANGUAGES_VARIABLE",
    "catalogue",
    "catalogue_files",
    "catalogue_folder",
    "english_words",
    "register_translations",
    "requested_languages",
    "stored_words",
    "translate_figure",
    "translated",
    "update_catalogues",
]

#: The environment variable that asks for the figures' other languages (comma-separated).
LANGUAGES_VARIABLE = "ROPE_TUTOR_FIGURE_LANGUAGES"
#: The output entry of a translated figure: data = its word pairs, metadata = its picture.
FIGURE_MIME = "application/vnd.rope-tutor.figure-translation+json"
#: Per language: the font families tried in order (the first one installed is used).
FONTS: dict[str, tuple[str, ...]] = {"zh_CN": ("Noto Sans CJK SC", "Source Han Sans SC")}
#: What installs such a font, for the error message when none is found.
_FONT_HINT = {
    "zh_CN": "Debian/Ubuntu: apt-get install fonts-noto-cjk (make browser does it as root)",
}
#: Words a translated figure keeps as they are: names of methods, models, libraries and units.
KEPT_WORDS = frozenset(
    """
    RoPE NoPE ALiBi PI NTK NTK-aware YaRN LongRoPE Llama Llama-3-8B SmolLM SmolLM2 SmolLM2-135M
    GPT T5 BERT PaLM GQA MHA Meta CPU GPU CUDA AVX AVX2 AVX-512 H100 H200 HBM DRAM
    PyTorch Triton Liger flash-attn transformers sympy numpy HF Hugging Face GGUF
    fp32 fp16 bf16 float32 float16 bfloat16 float64 NaN
    ms µs ns GB MB KB GiB MiB TB Gop nats bits dB
    sin cos exp PE RMS logit clone GPT-J GPT-NeoX RoFormer
    """.split()
)
#: Code and numbers, which stay as written: a name with an underscore or a dot (``copy_``,
#: ``torch.compile``, ``expr.py``, ``β_fast``), a call (``clone()``), a number in e-notation.
_CODE = re.compile(r"\S*_\S*|\w+(?:\.\w+)+|\w+\(\)|\b\d+(?:\.\d+)?e[-+−]?\d+\b")
_MATH = re.compile(r"(?<!\\)\$.*?(?<!\\)\$")
_WORD = re.compile(r"[A-Za-z][A-Za-z0-9'’-]*[A-Za-z0-9]|[A-Za-z]")


def english_words(text: str) -> list[str]:
    """The words of ``text`` that a translation must replace: runs of two or more Latin letters
    outside ``$...$`` and code that are not in :data:`KEPT_WORDS` (``"dynamic NTK, $s_d$ = 2"``
    -> ``["dynamic"]``)."""
    words = _WORD.findall(_CODE.sub(" ", _MATH.sub(" ", text)))
    return [w for w in words if len(w) > 1 and w not in KEPT_WORDS and not _is_symbol(w)]


def _is_symbol(word: str) -> bool:
    # L1, W2: a letter with digits is a symbol (2L and d_h are split into single letters).
    return bool(re.fullmatch(r"[A-Za-z]\d+", word))


def requested_languages() -> tuple[str, ...]:
    """The languages named by ``ROPE_TUTOR_FIGURE_LANGUAGES`` (empty when it is unset or empty).

    Raises ``ValueError`` naming the variable and the value for a language with no font known.
    """
    value = os.environ.get(LANGUAGES_VARIABLE, "")
    languages = tuple(part.strip() for part in value.split(",") if part.strip())
    for language in languages:
        if language not in FONTS:
            raise ValueError(
                f"{LANGUAGES_VARIABLE}={value!r}: unknown language {language!r}; "
                f"known: {', '.join(sorted(FONTS))}"
            )
    return languages


def catalogue_folder(language: str) -> Path:
    """Where ``language``'s figure words are: ``rope_tutor/locale/<language>/``, in the package."""
    return Path(str(files("rope_tutor") / "locale" / language))


def catalogue_files(language: str, folder: Path | None = None) -> list[Path]:
    """The ``.po`` files of ``language``'s figure words in ``folder`` (default: the package's)."""
    folder = catalogue_folder(language) if folder is None else Path(folder)
    return sorted(p for p in folder.iterdir() if p.name.endswith(".po"))


@functools.cache
def catalogue(language: str) -> dict[str, str]:
    """English text -> translation, from every ``rope_tutor/locale/<language>/*.po`` file.

    Untranslated and fuzzy messages are left out. Raises ``ValueError`` when two files translate
    one text differently. Needs ``babel`` (in the book's environment).
    """
    from babel.messages.pofile import read_po

    words: dict[str, str] = {}
    for path in catalogue_files(language):
        with path.open("rb") as handle:
            for message in read_po(handle, locale=language):
                if not message.id or not message.string or message.fuzzy:
                    continue
                if words.get(message.id, message.string) != message.string:
                    raise ValueError(f"{path.name}: {message.id!r} has two translations")
                words[message.id] = message.string
    return words


@functools.cache
def _font_family(language: str) -> str:
    from matplotlib import font_manager

    def installed() -> set[str]:
        return {entry.name for entry in font_manager.fontManager.ttflist}

    if not any(family in installed() for family in FONTS[language]):
        # Matplotlib's font cache predates the font (installed after matplotlib first ran): add
        # the system's font files whose names say CJK, every face of a collection.
        for path in font_manager.findSystemFonts():
            if "CJK" in Path(path).name or "SourceHan" in Path(path).name:
                font_manager.fontManager.addfont(path)
    for family in FONTS[language]:
        if family in installed():
            return family
    raise RuntimeError(
        f"{LANGUAGES_VARIABLE} asks for {language} figures, which need one of the fonts "
        f"{', '.join(FONTS[language])}: {_FONT_HINT[language]}"
    )


class _TranslatedFormatter:
    """A tick formatter that translates what the original one writes (for worded tick labels)."""

    def __init__(self, original: Any, translate: Any) -> None:
        self.original, self.translate = original, translate

    def __getattr__(self, name: str) -> Any:
        return getattr(self.original, name)

    def __call__(self, x: float, pos: int | None = None) -> str:
        return self.translate(self.original(x, pos))

    def format_ticks(self, values: Any) -> list[str]:
        return [self.translate(label) for label in self.original.format_ticks(values)]

    def get_offset(self) -> str:
        return self.translate(self.original.get_offset())

    def set_axis(self, axis: Any) -> None:
        self.original.set_axis(axis)


@contextmanager
def _words_replaced(fig: Any, translate: Any) -> Iterator[None]:
    """Within the block, every text of ``fig`` reads ``translate(text)``; restored afterwards."""
    from matplotlib.text import Text

    tick_texts: set[int] = set()
    swapped: list[tuple[Any, str, Any, bool]] = []
    for ax in fig.axes:
        for axis in [ax.xaxis, ax.yaxis, *([ax.zaxis] if hasattr(ax, "zaxis") else [])]:
            for which in ("major", "minor"):
                ticker = getattr(axis, which)
                default = getattr(axis, f"isDefault_{which[:3]}fmt")
                swapped.append((axis, which, ticker.formatter, default))
                ticks = axis.get_major_ticks() if which == "major" else axis.get_minor_ticks()
                tick_texts.update(id(t) for tick in ticks for t in (tick.label1, tick.label2))
            tick_texts.add(id(axis.offsetText))
    texts = [
        t for t in fig.findobj(Text) if id(t) not in tick_texts and t.get_text()
    ]
    originals = [t.get_text() for t in texts]
    try:
        for axis, which, formatter, _ in swapped:
            wrapped = _TranslatedFormatter(formatter, translate)
            getattr(axis, f"set_{which}_formatter")(wrapped)
        for text, original in zip(texts, originals, strict=True):
            text.set_text(translate(original))
        yield
    finally:
        for text, original in zip(texts, originals, strict=True):
            text.set_text(original)
        for axis, which, formatter, default in swapped:
            getattr(axis, f"set_{which}_formatter")(formatter)
            setattr(axis, f"isDefault_{which[:3]}fmt", default)


@contextmanager
def translated(fig: Any, language: str) -> Iterator[dict[str, str | None]]:
    """Within the block, ``fig`` draws its words in ``language``, in that language's font.

    Yields the dict of texts met so far (English -> translation, ``None`` when the catalogue has
    none), filled as the figure is drawn. The figure is left as it was. Raises ``RuntimeError``
    on leaving the block when the font lacked a glyph of a drawn text, or on entering it when no
    font is installed.
    """
    from matplotlib import rc_context

    if language not in FONTS:
        raise ValueError(f"language={language!r}: expected one of {sorted(FONTS)}")
    words = catalogue(language)
    family = _font_family(language)
    pairs: dict[str, str | None] = {}

    def translate(text: str) -> str:
        if not text or not english_words(text):
            return text
        pairs[text] = words.get(text)
        return words.get(text, text)

    fonts = {key: [family, "DejaVu Sans"] for key in ("font.sans-serif", "font.serif")}
    with (
        _words_replaced(fig, translate),
        rc_context(fonts),
        warnings.catch_warnings(record=True) as caught,
    ):
        warnings.simplefilter("always")
        yield pairs
    # Any other warning of this drawing was the English drawing's too, and was shown then.
    missing = sorted({str(w.message) for w in caught if "missing from font" in str(w.message)})
    if missing:
        raise RuntimeError(f"{language} figure: {'; '.join(missing)}")


def translate_figure(
    fig: Any, language: str, **savefig: Any
) -> tuple[str, list[list[str | None]]]:
    """Draw ``fig`` again with its words in ``language``: (PNG as base64, word pairs).

    Drawn as the notebook draws its English figure (IPython's ``print_figure``, with
    ``bbox_inches="tight"``); ``savefig`` keywords (``dpi=110``, ``bbox_inches=None``) override.
    The pairs are ``[English text, translation or None]`` for every text of the figure that has
    :func:`english_words`, sorted. The figure is left as it was. Raises ``RuntimeError`` when
    the font lacks a glyph of a translation, or when no font is installed.
    """
    from IPython.core.pylabtools import print_figure

    with translated(fig, language) as pairs:
        png = print_figure(fig, fmt="png", base64=True, **{"bbox_inches": "tight", **savefig})
    return png, [[en, pairs[en]] for en in sorted(pairs)]


def register_translations(languages: tuple[str, ...] | None = None) -> bool:
    """Make every figure the IPython kernel shows carry its translations (see the module).

    ``languages`` defaults to :func:`requested_languages`. Returns ``False`` (and does nothing)
    outside IPython or when no language is asked for; registering twice is harmless.
    """
    languages = requested_languages() if languages is None else languages
    try:
        from IPython import get_ipython
    except ImportError:
        return False
    shell = get_ipython()
    if shell is None or not languages:
        return False
    from IPython.core.formatters import JSONFormatter
    from matplotlib.figure import Figure, FigureBase

    def translations(fig: Figure) -> tuple[dict[str, Any], dict[str, Any]]:
        data: dict[str, Any] = {}
        pictures: dict[str, Any] = {}
        for language in languages:
            png, pairs = translate_figure(fig, language)
            data[language] = pairs
            pictures[language] = {"image/png": png}
        return data, pictures

    formatter = JSONFormatter(parent=shell.display_formatter)
    formatter.format_type = FIGURE_MIME
    # Registered for Figure's base class: when the inline backend starts (at the first figure,
    # after this), IPython removes every formatter's printer of Figure itself, and lookups follow
    # the class's MRO.
    formatter.for_type(FigureBase, translations)
    shell.display_formatter.formatters[FIGURE_MIME] = formatter
    active = list(shell.display_formatter.active_types)  # a kernel fixes its list at start
    if FIGURE_MIME not in active:
        shell.display_formatter.active_types = [*active, FIGURE_MIME]
    return True



def stored_words(notebook: dict[str, Any], language: str) -> list[list[str | None]]:
    """The word pairs of ``language`` that a notebook's stored figures carry, in order, each once.

    ``notebook`` is the notebook's JSON (a dict); a figure without the entry adds nothing.
    """
    pairs: dict[str, str | None] = {}
    for cell in notebook.get("cells", []):
        for output in cell.get("outputs", []):
            entry = output.get("data", {}).get(FIGURE_MIME, {})
            for english, translation in entry.get(language, []):
                pairs.setdefault(english, translation)
    return [[english, translation] for english, translation in pairs.items()]


def update_catalogues(
    notebooks: list[Path], language: str, folder: Path | None = None
) -> dict[str, list[str]]:
    """Add to ``rope_tutor/locale/<language>/`` every figure text of ``notebooks`` that no
    catalogue has yet, with an empty translation for a translator to fill in.

    A text seen in one chapter goes to that chapter's file (``<notebook stem>.po``); a text seen
    in several goes to ``common.po``. Run after ``make execute`` (whose stored figures list their
    texts), then translate, then ``make execute`` again. Returns, per file, the texts added, and
    under ``"unused"`` the catalogue's texts that no notebook shows any more (left for a person to
    remove). ``folder`` defaults to the package's ``rope_tutor/locale/<language>/``.
    """
    import json

    from babel.messages.catalog import Catalog
    from babel.messages.pofile import read_po, write_po

    seen: dict[str, list[str]] = {}
    for path in notebooks:
        notebook = json.loads(Path(path).read_text(encoding="utf-8"))
        for english, _ in stored_words(notebook, language):
            seen.setdefault(english, []).append(Path(path).stem)
    folder = catalogue_folder(language) if folder is None else Path(folder)
    known: set[str] = set()
    catalogues: dict[str, Catalog] = {}
    for path in catalogue_files(language, folder):
        with path.open("rb") as handle:
            catalogues[path.stem] = read_po(handle, locale=language)
        known.update(message.id for message in catalogues[path.stem] if message.id)
    added: dict[str, list[str]] = {}
    for english, chapters in seen.items():
        if english in known:
            continue
        stem = chapters[0] if len(set(chapters)) == 1 else "common"
        if stem not in catalogues:
            catalogues[stem] = Catalog(
                locale=language,
                project="rope-tutor",
                fuzzy=False,
                header_comment=f"# The words of the figures of {stem}, in {language}: "
                "see rope_tutor/figures.py.",
            )
        catalogues[stem].add(english, "")
        added.setdefault(stem, []).append(english)
    for stem in added:
        with (folder / f"{stem}.po").open("wb") as handle:
            write_po(handle, catalogues[stem], width=100, omit_header=False)
    added["unused"] = sorted(known - set(seen))
    return added


if __name__ == "__main__":
    import sys

    chosen = requested_languages() or ("zh_CN",)
    for lang in chosen:
        report = update_catalogues([Path(p) for p in sys.argv[1:]], lang)
        for stem, texts in report.items():
            what = "unused" if stem == "unused" else "added"
            print(f"{lang} {stem}: {len(texts)} text(s) {what}")
