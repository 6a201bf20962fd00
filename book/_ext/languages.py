"""Sphinx extension of the book: the English and the Chinese edition, each page linked to its twin.

Both editions are built by Jupyter Book from the same ``_config.yml`` and the same executed
notebooks (``execute_notebooks: "off"``). The Chinese one is the same build with the environment
variable ``ROPE_TUTOR_LANGUAGE=zh_CN`` (`make book-zh`): this extension then sets Sphinx's
``language`` before the documents are read, so Sphinx's own i18n replaces each message by its
translation from ``locales/zh_CN/LC_MESSAGES/<docname>.po`` (compiled to ``.mo`` by Sphinx).
Jupyter Book 1.x has no command-line option for ``language``, hence the variable. Five repairs
make translated pages complete: the theme's and the extensions' own words ("Contents",
"Solution", the search box) are loaded in the edition's language, with the project's own
catalogues (``locales/zh_CN/LC_MESSAGES/booktheme.po`` and the like) for the words the packages
leave untranslated; the table of contents' captions are translated, glued values
(`` {glue:text}`key` ``) work inside translated messages, and the alt texts of the figures (set in
a code cell's metadata) and of the animations (in an output's HTML) are extracted as messages and
translated, and each figure a notebook draws is shown in the edition's language, from the
translated picture ``make execute`` stored beside the English one (see each function).

The English site is ``_build/html``, the Chinese one ``_build/html/zh`` (see the Makefile). Every
page gets, above its text, a link to the same page in the other edition, and a
``<link rel="alternate" hreflang>`` in its head. The links are relative, so both sites work from
disk or from any host, offline.
"""

from __future__ import annotations

import gettext
import html
import json
import os
import re
from pathlib import Path
from typing import Any

#: The environment variable that selects the edition being built (unset: English).
LANGUAGE_VARIABLE = "ROPE_TUTOR_LANGUAGE"
#: Each edition: its Sphinx language code, its folder under _build/html, its name in itself.
EDITIONS = {
    "en": {"folder": "", "hreflang": "en", "name": "English"},
    "zh_CN": {"folder": "zh", "hreflang": "zh-CN", "name": "中文"},
}


def edition(language: str | None) -> str:
    """The edition (a key of ``EDITIONS``) of a Sphinx ``language`` value; ``None`` is English."""
    if language in (None, "", "en"):
        return "en"
    if language not in EDITIONS:
        raise ValueError(f"{LANGUAGE_VARIABLE}={language!r}: expected one of {sorted(EDITIONS)}")
    return language


def twin_href(pagename: str, current: str, other: str) -> str:
    """The relative address, from page ``pagename`` of edition ``current``, of the same page in
    edition ``other`` (``pagename`` is Sphinx's docname, e.g. ``book/03_sinusoidal``).

    >>> twin_href("book/03_sinusoidal", "en", "zh_CN")
    '../zh/book/03_sinusoidal.html'
    >>> twin_href("book/03_sinusoidal", "zh_CN", "en")
    '../../book/03_sinusoidal.html'
    """
    up = "../" * pagename.count("/")  # from the page's folder to its edition's root
    if EDITIONS[current]["folder"]:
        up += "../"  # from the Chinese root (_build/html/zh) to the English one
    folder = EDITIONS[other]["folder"]
    return f"{up}{folder + '/' if folder else ''}{pagename}.html"


#: How a notebook's JSON shows that it stores translated figures (``rope_tutor.figures``).
FIGURE_MIME_TAG = "vnd.rope-tutor.figure-translation"

#: The image types of the notebooks' outputs that the gettext builder must keep (see below).
IMAGE_MIME_TYPES = ("image/svg+xml", "image/png", "image/jpeg", "image/gif")


def _extract_figure_alt_texts(config: Any) -> None:
    """Make the gettext builder extract the alt text of every figure a code cell draws.

    myst-nb renders each output in every format at read time (an ``image`` node, with the alt
    text of the cell's ``"mystnb": {"image": {"alt": ...}}`` metadata, beside a ``text/plain``
    one) and keeps one per builder in a post-transform (``SelectMimeType``), by the builder's
    priority list. The ``gettext`` builder's list has no image type, so it kept the
    ``text/plain`` output and Sphinx never saw the alt text: the .po files lacked it and the
    Chinese pages showed it in English. Giving the image types the first places for ``gettext``
    (myst-nb's ``nb_mime_priority_overrides``) keeps the ``image`` node, whose ``alt`` Sphinx's
    gettext builder extracts as a message of the page; at read time, Sphinx's i18n transform
    then replaces it with the translation in every language build (the node exists then).
    """
    overrides = list(config.nb_mime_priority_overrides or [])
    overrides += [("gettext", mime, rank) for rank, mime in enumerate(IMAGE_MIME_TYPES, 1)]
    config.nb_mime_priority_overrides = overrides


def figures_of_edition(notebook: dict[str, Any], language: str) -> int:
    """Make each figure of a notebook (its JSON, changed in place) that of ``language``'s edition.

    A figure stored by ``make execute`` carries its translated pictures beside the English one
    (``rope_tutor.figures``): an output entry ``FIGURE_MIME`` whose metadata holds, per language,
    an ``image/png`` (an animation: its player's ``text/html``). For the Chinese edition that
    picture replaces the English one; every edition drops the entry itself, which no page shows.
    Returns the number of pictures replaced. A figure without a picture of the edition's language
    is left English: the tests (``tests/test_figure_words.py``) see to it that none is.
    """
    from rope_tutor.figures import FIGURE_MIME

    replaced = 0
    for cell in notebook.get("cells", []):
        for output in cell.get("outputs", []):
            data, metadata = output.get("data", {}), output.get("metadata", {})
            pictures = metadata.pop(FIGURE_MIME, {})
            if data.pop(FIGURE_MIME, None) is None:
                continue
            for mime, picture in pictures.get(language, {}).items():  # image/png, or an
                if mime in data:  # animation's player (text/html)
                    data[mime] = picture
                    replaced += 1
    return replaced


def _figures_in_edition_language(app: Any, docname: str, source: list[str]) -> None:
    """``source-read``: a notebook's figures in the language being built (see above)."""
    if not str(app.env.doc2path(docname)).endswith(".ipynb") or FIGURE_MIME_TAG not in source[0]:
        return
    notebook = json.loads(source[0])
    figures_of_edition(notebook, edition(app.config.language))
    source[0] = json.dumps(notebook, ensure_ascii=False)


def _set_language(app: Any, config: Any) -> None:
    _extract_figure_alt_texts(config)
    wanted = os.environ.get(LANGUAGE_VARIABLE)
    if wanted:
        config.language = edition(wanted)
        # Sphinx set up its own messages (search box, "Contents") before the extensions were
        # loaded, in the language of conf; set them up again in the edition's language.
        app._init_i18n()
        _load_extension_catalogs(app, config)
        if config.language == "zh_CN":
            _chinese_citations_and_author(config)


#: How the Chinese edition joins authors' names in a citation (English: ", ", " and ", " et al.").
CHINESE_NAMES = {"sep": "、", "sep2": " 和 ", "last_sep": " 和 ", "other": " 等人"}


def _chinese_citations_and_author(config: Any) -> None:
    """Citations and the footer in Chinese words.

    sphinxcontrib-bibtex writes ``{cite:t}`` from its style, not from a message: "Su et al.
    [2021]" would stand in Chinese prose beside a translated "Shaw 等人". The Chinese edition
    gets the author-year style with Chinese joining words (:data:`CHINESE_NAMES`): "Su 等人
    [2021]", "Press 和 Lewis [2022]". The footer's author ("作者：…") is ``config.author``.
    """
    from dataclasses import dataclass, field

    from sphinxcontrib.bibtex.plugin import register_plugin
    from sphinxcontrib.bibtex.style.referencing import PersonStyle
    from sphinxcontrib.bibtex.style.referencing.author_year import AuthorYearReferenceStyle

    @dataclass
    class ChineseAuthorYearReferenceStyle(AuthorYearReferenceStyle):
        person: PersonStyle = field(default_factory=lambda: PersonStyle(**CHINESE_NAMES))

    name = f"{config.bibtex_reference_style}_zh_CN"
    register_plugin(
        "sphinxcontrib.bibtex.style.referencing", name, ChineseAuthorYearReferenceStyle, force=True
    )
    config.bibtex_reference_style = name
    config.author = "rope-tutor 作者团队"


def _extension_catalogs() -> dict[str, Path]:
    """The catalogues the theme and the extensions register in their ``setup()``, and where each
    package keeps its translations (the paths their ``setup()`` passes to Sphinx)."""
    import pydata_sphinx_theme
    import sphinx_book_theme
    import sphinx_exercise
    import sphinx_togglebutton

    return {
        "booktheme": Path(sphinx_book_theme.get_html_theme_path()) / "static" / "locales",
        "exercise": Path(sphinx_exercise.__file__).parent / "translations" / "locales",
        "togglebutton": Path(sphinx_togglebutton.__file__).parent / "translations" / "locales",
        "sphinx": Path(pydata_sphinx_theme.__file__).parent / "locale",
    }


def _load_extension_catalogs(app: Any, config: Any) -> None:
    """Load the theme's and the extensions' catalogues again, in the edition's language.

    Each package loads its catalogue in its ``setup()``, when ``language`` is still conf's
    (English), so "Contents", "Exercise" or "Repository" would stay English. The project's own
    catalogue of the same name (``locales/<language>/LC_MESSAGES/<catalog>.po``, compiled here)
    comes first, so it supplies what the package leaves untranslated; the package's fills the
    rest. Settings that the packages compute from a translated word at ``setup()`` (the toggle
    button's hints, the search box's placeholder) and the site's title are set again from the
    loaded catalogues.
    """
    from sphinx import locale
    from sphinx.util.i18n import CatalogInfo

    ours = [Path(app.srcdir, folder) for folder in config.locale_dirs]
    for catalog, theirs in _extension_catalogs().items():
        folders = [theirs]
        if catalog != "sphinx":  # Sphinx's own catalogue already holds the project's messages
            for base in ours:
                messages = base / config.language / "LC_MESSAGES"
                if (messages / f"{catalog}.po").is_file():
                    CatalogInfo(str(messages), catalog, "utf-8").write_mo(config.language)
            folders = [*ours, theirs]
            locale.translators.pop(("general", catalog), None)
        locale.init([str(folder) for folder in folders], config.language, catalog)
    toggle = locale.get_translation("togglebutton")
    config.togglebutton_hint = str(toggle("Click to show"))
    config.togglebutton_hint_hide = str(toggle("Click to hide"))
    _translate_code_prompts(config, ours)
    theme = locale.get_translation("booktheme")
    if config.html_title:  # the site's title, above the navigation and in each tab's title
        config.html_title = str(theme(config.html_title))
    search = config.html_theme_options.get("search_bar_text")
    if search:
        config.html_theme_options = {
            **config.html_theme_options,
            "search_bar_text": str(theme(search)),
        }


def _translate_code_prompts(config: Any, ours: list[Path]) -> None:
    """The buttons of a folded code cell (the ``hide-input`` tag): myst-nb writes its settings
    ``nb_code_prompt_show`` / ``nb_code_prompt_hide`` ("Show code cell {type}") into the page as
    they are, and has no catalogue, so the Chinese pages showed them in English. The project's
    ``locales/<language>/LC_MESSAGES/mystnb.po`` translates the two settings (their English text
    is the msgid); without it, or in English, they stay as configured."""
    from sphinx.util.i18n import CatalogInfo

    for base in ours:
        messages = base / config.language / "LC_MESSAGES"
        if not (messages / "mystnb.po").is_file():
            continue
        CatalogInfo(str(messages), "mystnb", "utf-8").write_mo(config.language)
        with open(messages / "mystnb.mo", "rb") as handle:
            catalog = gettext.GNUTranslations(handle)
        config.nb_code_prompt_show = catalog.gettext(config.nb_code_prompt_show)
        config.nb_code_prompt_hide = catalog.gettext(config.nb_code_prompt_hide)
        return


def _translate_toctree_captions(app: Any, doctree: Any) -> None:
    """Translate the captions of the table of contents (the parts: "Part I: Foundations").

    sphinx-external-toc inserts the toctrees into the root page after Sphinx's i18n transform has
    run, so their captions are extracted as messages of that page (``book/intro.po``) but never
    replaced; this replaces them from the same catalog, as the transform would.
    """
    if edition(app.config.language) == "en":
        return
    from sphinx import addnodes
    from sphinx.locale import init as init_locale
    from sphinx.util.i18n import docname_to_domain

    toctrees = [node for node in doctree.findall(addnodes.toctree) if node.get("caption")]
    if not toctrees:
        return
    domain = docname_to_domain(app.env.docname, app.config.gettext_compact)
    dirs = [os.path.join(app.srcdir, folder) for folder in app.config.locale_dirs]
    catalog, has_catalog = init_locale(dirs, app.config.language, domain)
    if not has_catalog:
        return
    for node in toctrees:
        node["caption"] = catalog.gettext(node["caption"])


#: An ``alt`` attribute in an output's raw HTML (the animations of ``rope_tutor.animation_html``).
RAW_ALT = re.compile(r'(<img\b[^>]*?\salt=")([^"]*)(")')


def _raw_html_alt_texts(app: Any, doctree: Any) -> None:
    """Extract and translate the alt texts inside the HTML outputs of code cells (animations).

    An animation is stored as ``text/html`` (``rope_tutor.animation_html`` sets ``alt`` on its
    frame image), a ``raw`` node that Sphinx's i18n neither extracts nor translates. In the gettext
    build each such alt text gets an image node of its own, with a uid, so the gettext
    builder extracts it as a message of the page; in a translated build, the alt attribute is
    replaced by its translation from the page's catalogue (English where there is none).
    """
    from docutils import nodes

    raws = [
        node
        for node in doctree.findall(nodes.raw)
        if "html" in node.get("format", "").split() and RAW_ALT.search(node.astext())
    ]
    if not raws:
        return
    if app.builder.name == "gettext":
        for node in raws:
            for match in RAW_ALT.finditer(node.astext()):
                image = nodes.image(uri="", alt=html.unescape(match.group(2)))
                image.source, image.line = node.source or doctree.get("source"), node.line
                image.uid = ""  # the gettext builder extracts only nodes that have a uid
                # At the page's top level: the output's own node may lose to its text/plain twin
                # in myst-nb's selection of one output per builder (see above).
                doctree.append(image)
        return
    if edition(app.config.language) == "en":
        return
    catalog = _page_catalog(app)
    if catalog is None:
        return

    def translate(match: re.Match[str]) -> str:
        translated = catalog.gettext(html.unescape(match.group(2)))
        return match.group(1) + html.escape(translated, quote=True) + match.group(3)

    for node in raws:
        node.replace_self(nodes.raw(node.rawsource, RAW_ALT.sub(translate, node.astext()),
                                    **node.attributes))


def _page_catalog(app: Any) -> Any:
    """The translations of the page being read (``None`` if it has no catalogue)."""
    from sphinx.locale import init as init_locale
    from sphinx.util.i18n import docname_to_domain

    domain = docname_to_domain(app.env.docname, app.config.gettext_compact)
    dirs = [os.path.join(app.srcdir, folder) for folder in app.config.locale_dirs]
    catalog, has_catalog = init_locale(dirs, app.config.language, domain)
    return catalog if has_catalog else None


#: The renderer of the notebook myst-nb parsed last (pages are read one at a time per process).
_LATEST_RENDERER: list[Any] = []


def _glue_lookup_for_translations() -> None:
    """Make a notebook's glued values available to its translated messages.

    Sphinx's i18n transform parses each translated message as a document of its own, after
    myst-nb has parsed the page and dropped its renderer (which holds the notebook's glue data), so
    a `` {glue:text}`key` `` in a translation would fail ("No key ... found in glue data"). This
    keeps the renderer of the notebook myst-nb parsed last, and wraps ``retrieve_glue_data`` (as
    myst-nb's roles and directives imported it) so
    that a translated message of that page (its source names the page) uses it. Written for
    myst-nb 1.4 and Sphinx 7.4 (pinned in requirements.txt).
    """
    from myst_nb import sphinx_
    from myst_nb.ext.glue import directives, roles, utils

    if getattr(utils.retrieve_glue_data, "rope_tutor_wrapped", False):
        return
    original_load, original_retrieve = sphinx_.load_renderer, utils.retrieve_glue_data

    def load_renderer(name: str) -> Any:
        renderer_class = original_load(name)

        def create(*args: Any, **kwargs: Any) -> Any:
            _LATEST_RENDERER[:] = [renderer_class(*args, **kwargs)]
            return _LATEST_RENDERER[0]

        return create

    def retrieve(document: Any, key: str) -> Any:
        if "nb_renderer" not in document and _LATEST_RENDERER:
            renderer = _LATEST_RENDERER[0]
            page = renderer.renderer.document.get("source", "")
            # A translated message's source is "<page's source>:<line>:<translated>".
            if page and str(document.get("source", "")).startswith(f"{page}:"):
                document["nb_renderer"] = renderer
                try:
                    return original_retrieve(document, key)
                finally:  # the message's nodes join the page's doctree, which must pickle
                    del document["nb_renderer"]
        return original_retrieve(document, key)

    retrieve.rope_tutor_wrapped = True  # type: ignore[attr-defined]
    sphinx_.load_renderer = load_renderer
    for module in (utils, roles, directives):
        module.retrieve_glue_data = retrieve


def _language_links(
    app: Any, pagename: str, templatename: str, context: dict[str, Any], doctree: Any
) -> None:
    current = edition(app.config.language)
    links, alternates = [], []
    for other, info in EDITIONS.items():
        if other == current:
            continue
        href = twin_href(pagename, current, other)
        links.append(
            f'<a class="rope-tutor-language" href="{href}" hreflang="{info["hreflang"]}" '
            f'lang="{info["hreflang"]}">{info["name"]}</a>'
        )
        alternates.append(f'<link rel="alternate" hreflang="{info["hreflang"]}" href="{href}" />')
    context["metatags"] = context.get("metatags", "") + "\n".join(alternates)
    if "body" in context:
        switch = '<p class="rope-tutor-languages">' + " · ".join(links) + "</p>\n"
        context["body"] = switch + context["body"]


def setup(app: Any) -> dict[str, Any]:
    # before the extensions' own config-inited handlers (sphinx-exercise's "Exercise %s" number
    # format is made from a translated word there)
    app.connect("config-inited", _set_language, priority=100)
    _glue_lookup_for_translations()
    app.connect("source-read", _figures_in_edition_language)
    app.connect("doctree-read", _translate_toctree_captions)
    app.connect("doctree-read", _raw_html_alt_texts)
    app.connect("html-page-context", _language_links)
    return {"parallel_read_safe": True, "parallel_write_safe": True}
