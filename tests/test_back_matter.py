"""The back matter cannot go stale: the exercise index lists every exercise, and the bibliography
holds the works the book is built on, complete."""

from __future__ import annotations

import json
import re

import pytest
from conftest import ROOT, toc_notebooks
from pybtex.database import parse_file

from rope_tutor.exercises import get_exercise, list_exercises

INDEX = ROOT / "book" / "exercises_index.md"
LABEL = re.compile(r":label:\s*(ex-[A-Za-z0-9_-]+)")
ROW = re.compile(r"^\|\s*\{ref\}`(ex-[A-Za-z0-9_-]+)`\s*\|\s*\{doc\}`([^`]+)`\s*\|(.*)$", re.M)


def book_exercise_labels() -> dict[str, str]:
    """Every sphinx-exercise label in the book's notebooks, mapped to its chapter (file stem)."""
    labels = {}
    for notebook in toc_notebooks():
        path = ROOT / notebook
        if not path.exists():
            continue
        for cell in json.loads(path.read_text(encoding="utf-8"))["cells"]:
            if cell["cell_type"] == "markdown":
                for label in LABEL.findall("".join(cell["source"])):
                    labels[label] = path.stem
    return labels


def index_rows() -> dict[str, tuple[str, str]]:
    """The index's table: label -> (chapter, rest of the row)."""
    return {label: (chapter, rest) for label, chapter, rest in ROW.findall(INDEX.read_text())}


def label_candidates(name: str) -> list[str]:
    """The labels an exercise may carry: ``ex-<name>`` (as registered) or with hyphens."""
    return [f"ex-{name}", f"ex-{name.replace('_', '-')}"]


@pytest.mark.parametrize("name", list_exercises())
def test_every_registered_exercise_is_in_the_index(name: str) -> None:
    rows = index_rows()
    listed = [label for label in label_candidates(name) if label in rows]
    assert listed, (
        f"exercise {name!r} ({get_exercise(name).summary}) is missing from {INDEX.name}: add a "
        f"row | {{ref}}`ex-{name}` | {{doc}}`<chapter>` | `{name}` | ... |"
    )
    assert f"`{name}`" in rows[listed[0]][1], f"the row of {listed[0]} does not name `{name}`"


def test_every_exercise_of_the_book_is_in_the_index() -> None:
    rows = index_rows()
    labels = book_exercise_labels()
    missing = sorted(set(labels) - set(rows))
    assert not missing, f"exercises of the book missing from {INDEX.name}: {missing}"
    wrong_chapter = {
        label: (rows[label][0], chapter)
        for label, chapter in labels.items()
        if rows[label][0] != chapter
    }
    assert not wrong_chapter, f"index rows naming the wrong chapter (index, book): {wrong_chapter}"


def test_every_index_row_is_an_exercise_of_the_book() -> None:
    labels = book_exercise_labels()
    stale = sorted(set(index_rows()) - set(labels))
    assert not stale, f"{INDEX.name} links to exercises that are not in the book: {stale}"


def test_index_rows_are_in_book_order() -> None:
    # sphinx-exercise numbers exercises in document order, chapter by chapter (Exercise 5.1, 5.2,
    # ...): the index says it is in book order, so its rows follow that numbering.
    labels, rows = book_exercise_labels(), index_rows()
    book_order = [label for label in labels if label in rows]
    index_order = [label for label in rows if label in labels]
    assert index_order == book_order, (
        f"{INDEX.name} rows out of book order; the book's order is {book_order}"
    )


REQUIRED_WORKS = {
    # key: (a word of the title, first author's family name, year)
    "vaswani2017attention": ("Attention", "Vaswani", "2017"),
    "su2021roformer": ("RoFormer", "Su", "2021"),
    "press2022alibi": ("Linear Biases", "Press", "2022"),
    "chen2023pi": ("Positional Interpolation", "Chen", "2023"),
    "bloc97ntk2023": ("NTK-Aware", "bloc97", "2023"),
    "emozilla2023dynamic": ("Dynamically Scaled", "emozilla", "2023"),
    "peng2023yarn": ("YaRN", "Peng", "2024"),
    "dubey2024llama3": ("Llama 3 Herd", "Llama Team", "2024"),
    "ding2024longrope": ("LongRoPE", "Ding", "2024"),
    "kazemnejad2023nope": ("Length Generalization", "Kazemnejad", "2023"),
}


def test_the_bibliography_holds_the_works_the_book_is_built_on() -> None:
    entries = parse_file(str(ROOT / "book" / "references.bib")).entries
    for key, (title_word, author, year) in REQUIRED_WORKS.items():
        assert key in entries, f"references.bib lacks {key}"
        entry = entries[key]
        title = re.sub(r"[{}]", "", entry.fields["title"])
        assert title_word.lower() in title.lower(), f"{key}: unexpected title {title!r}"
        first = entry.persons["author"][0]
        assert author in str(first), f"{key}: first author {first} is not {author}"
        assert entry.fields["year"] == year, f"{key}: year {entry.fields['year']}, not {year}"
    for key, entry in entries.items():
        missing = {"title", "year"} - set(entry.fields)
        assert not missing and entry.persons.get("author"), f"{key} lacks {missing or 'author'}"
