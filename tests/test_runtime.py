"""Device choice, seeding and the notebook set-up."""

from __future__ import annotations

import random
from pathlib import Path

import matplotlib as mpl
import numpy as np
import pytest
import torch

import rope_tutor as rt
from rope_tutor import runtime


@pytest.fixture(autouse=True)
def _restore_global_state():
    """seed_everything changes process-wide settings: put them back after each test."""
    threads = torch.get_num_threads()
    deterministic = torch.are_deterministic_algorithms_enabled()
    warn_only = torch.is_deterministic_algorithms_warn_only_enabled()
    with mpl.rc_context():
        yield
    torch.set_num_threads(threads)
    torch.use_deterministic_algorithms(deterministic, warn_only=warn_only)


def draws() -> tuple[float, float, list[float]]:
    return random.random(), float(np.random.rand()), torch.randn(3).tolist()  # noqa: NPY002


def test_get_device_prefers_cuda(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("ROPE_TUTOR_DEVICE", raising=False)
    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    assert runtime.get_device() == torch.device("cuda")
    monkeypatch.setattr(torch.cuda, "is_available", lambda: False)
    assert runtime.get_device() == torch.device("cpu")


def test_get_device_can_be_forced(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    monkeypatch.setenv("ROPE_TUTOR_DEVICE", "cpu")
    assert runtime.get_device() == torch.device("cpu")


def test_get_device_rejects_a_bad_forced_device(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("ROPE_TUTOR_DEVICE", "not-a-device")
    with pytest.raises(RuntimeError, match="not-a-device"):
        runtime.get_device()


def test_seed_everything_is_deterministic() -> None:
    runtime.seed_everything(123)
    first = draws()
    runtime.seed_everything(123)
    assert draws() == first
    runtime.seed_everything(124)
    assert draws() != first


def test_seed_everything_pins_threads_and_deterministic_kernels() -> None:
    other = runtime.DEFAULT_THREADS + 1  # a count the default is not, so each step is visible
    runtime.seed_everything(0, threads=other)
    assert torch.get_num_threads() == other
    assert torch.are_deterministic_algorithms_enabled()
    runtime.seed_everything(0)
    assert torch.get_num_threads() == runtime.DEFAULT_THREADS
    torch.set_num_threads(other)
    runtime.seed_everything(0, threads=None)
    assert torch.get_num_threads() == other


@pytest.mark.parametrize(
    ("kwargs", "message"),
    [
        ({"seed": -1}, "seed must be an int >= 0, got seed=-1"),
        ({"seed": 1.5}, r"seed must be an int >= 0, got seed=1\.5"),
        ({"seed": True}, "seed must be an int >= 0, got seed=True"),
        ({"seed": 0, "threads": 0}, "threads must be a positive int, got threads=0"),
        ({"seed": 0, "threads": 2.0}, r"threads must be a positive int, got threads=2\.0"),
    ],
)
def test_seed_everything_bad_input(kwargs: dict, message: str) -> None:
    with pytest.raises(ValueError, match=message):
        runtime.seed_everything(**kwargs)


def test_notebook_setup(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("ROPE_TUTOR_DEVICE", "cpu")
    mpl.rcParams["figure.dpi"] = 300
    device = runtime.notebook_setup(7)
    assert device == torch.device("cpu")
    assert mpl.rcParams["figure.dpi"] == 90
    assert mpl.rcParams["figure.facecolor"] == "white"
    first = torch.randn(2).tolist()
    runtime.notebook_setup(7)
    assert torch.randn(2).tolist() == first


def test_animation_html_works_offline_and_describes_itself() -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    from bs4 import BeautifulSoup
    from matplotlib.animation import FuncAnimation

    fig, ax = plt.subplots(figsize=(1, 1), dpi=20)
    (line,) = ax.plot([], [])
    animation = FuncAnimation(fig, lambda t: (line.set_data([0, t], [0, t]), line)[1:], frames=3)
    raw = animation.to_jshtml()
    assert "font-awesome" in raw  # what matplotlib does by itself: a CDN stylesheet
    html = rt.animation_html(animation, alt='a line "grows"', default_mode="loop")
    plt.close(fig)
    soup = BeautifulSoup(html, "html.parser")
    assert not soup.find_all("link"), "the player still links a stylesheet"
    assert not soup.select("i.fa"), "a Font Awesome icon is left"
    assert soup.find("img")["alt"] == 'a line "grows"'
    assert len(soup.find_all("button")) == len(soup.select("button > span[aria-hidden]")) == 9
    with pytest.raises(ValueError, match="alt must describe the animation"):
        rt.animation_html(animation, alt=" ")


def test_pinned_package_checks_presence_and_exact_version() -> None:
    import sympy

    from rope_tutor.runtime import pinned_package

    assert pinned_package("sympy", sympy.__version__, "data") == Path(sympy.__file__).parent
    with pytest.raises(
        RuntimeError, match=rf"sympy==0\.1, but sympy=={sympy.__version__} is installed"
    ):
        pinned_package("sympy", "0.1", "data")
    with pytest.raises(
        ModuleNotFoundError, match=r"no_such_package_xyz==1\.0, which is not installed"
    ):
        pinned_package("no_such_package_xyz", "1.0", "data")


def _glued_outputs(monkeypatch: pytest.MonkeyPatch, *, with_myst_nb: bool) -> list[tuple]:
    """What ``rt.glue`` hands to IPython's display for a few values, with or without myst-nb."""
    import IPython.display
    import myst_nb.ext.glue

    calls: list[tuple] = []

    def record(*objects, **kwargs):
        calls.append((objects, kwargs))

    monkeypatch.setattr(IPython.display, "display", record)
    monkeypatch.setattr(myst_nb.ext.glue, "ipy_display", record)
    if not with_myst_nb:  # as on Colab: the package alone, no myst-nb
        real_find_spec = runtime.importlib.util.find_spec
        monkeypatch.setattr(
            runtime.importlib.util,
            "find_spec",
            lambda name, *a: None if name == "myst_nb" else real_find_spec(name, *a),
        )
    glued = [("share", 0.95, False), ("count", 54410, False), ("n", "4T", True)]
    for name, value, display in glued:
        rt.glue(name, value, display=display)
    return calls


def test_glue_without_myst_nb_stores_what_myst_nb_stores(monkeypatch: pytest.MonkeyPatch) -> None:
    with_myst = _glued_outputs(monkeypatch, with_myst_nb=True)
    monkeypatch.undo()
    without = _glued_outputs(monkeypatch, with_myst_nb=False)
    assert len(with_myst) == 3 and without == with_myst
    (bundle,), options = with_myst[0]
    assert bundle == {"application/papermill.record/text/plain": "0.95"}
    assert options["metadata"]["scrapbook"] == {
        "name": "share",
        "mime_prefix": "application/papermill.record/",
    }


def test_glue_rejects_a_bad_name() -> None:
    with pytest.raises(ValueError, match="name must be a non-empty string, got name=''"):
        rt.glue("", 1.0)
