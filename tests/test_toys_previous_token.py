"""The toy of chapter 2 (rope_tutor.toys.previous_token), checked against independent references.

Row copies against the rows themselves, interpolation against ``numpy.interp`` column by column,
the window mask against its definition written out entry by entry, training against the task's
property (the previous token needs positions), and bad input against a clear ``ValueError``.
"""

from __future__ import annotations

import re

import numpy as np
import pytest
import torch

from rope_tutor.toys import previous_token as toy


def _untrained(seed: int = 0, use_positions: bool = True) -> toy.PreviousTokenModel:
    torch.manual_seed(seed)
    return toy.PreviousTokenModel(use_positions)


@pytest.fixture(scope="module")
def trained() -> toy.PreviousTokenModel:
    return toy.train(use_positions=True, device="cpu")


def test_the_input_is_the_token_row_plus_the_position_row() -> None:
    # Equation (learned-pe): x_t = E[w_t] + P[start + t]
    model = _untrained()
    ids = torch.tensor([[3, 0, 15, 7]])
    for start in (0, 5, toy.TABLE_ROWS - 4):
        expected = torch.stack([model.tokens.weight[w] + model.positions.table.weight[start + t]
                                for t, w in enumerate(ids[0].tolist())])
        assert torch.allclose(model.embed(ids, start)[0], expected)
    assert model(ids).shape == (1, 4, toy.VOCAB)


def test_copy_rows_repeats_rows_0_to_15_and_leaves_the_model_untouched() -> None:
    model = _untrained()
    before = {name: p.detach().clone() for name, p in model.state_dict().items()}
    copied = toy.copy_rows(model)
    rows = copied.positions.table.weight.detach()
    assert rows.shape == (toy.TABLE_ROWS, toy.DIM) == (32, 32)
    assert torch.equal(rows[16:], rows[:16])
    assert torch.equal(rows[:16], before["positions.table.weight"][:16])
    for name, p in model.state_dict().items():  # the original keeps its random rows 16..31
        assert torch.equal(p, before[name]), name
    assert not torch.equal(model.positions.table.weight[16:], rows[16:])
    for name in ("tokens.weight", "read_out.weight", "read_out.bias"):  # the rest is copied as is
        assert torch.equal(copied.state_dict()[name], before[name])


def test_interpolate_rows_is_numpy_interp_column_by_column() -> None:
    model = _untrained(3)
    old = model.positions.table.weight.detach()[:16].double().numpy()  # (16, 32)
    new = toy.interpolate_rows(model).positions.table.weight.detach().double().numpy()  # (32, 32)
    where = np.arange(32) * 15 / 31  # row p is read off the old table at p * 15 / 31
    columns = [np.interp(where, np.arange(16), old[:, j]) for j in range(old.shape[1])]
    expected = np.stack(columns, axis=1)
    np.testing.assert_allclose(new, expected, rtol=0, atol=1e-6)
    np.testing.assert_allclose(new[0], old[0], rtol=0, atol=1e-7)  # first and last rows in place
    np.testing.assert_allclose(new[31], old[15], rtol=0, atol=1e-6)
    assert torch.equal(model.positions.table.weight.detach()[:16].double(), torch.from_numpy(old))


def test_the_window_mask_is_zero_exactly_inside_the_window() -> None:
    for window, length in [(toy.WINDOW, 32), (1, 5), (3, 7), (10, 4)]:
        mask = toy.window_bias(window, length=length)
        assert mask.shape == (length, length) and mask.dtype == torch.float32
        for m in range(length):
            for n in range(length):
                expected = 0.0 if abs(m - n) < window else float("-inf")
                assert mask[m, n].item() == expected, (window, m, n)
    assert toy.window_bias().shape == (2 * toy.SEQ_LEN, 2 * toy.SEQ_LEN)


def test_the_test_sequences_are_seeded_tokens_of_the_vocabulary() -> None:
    ids = toy.long_ids("cpu")
    assert ids.shape == (512, 32) and ids.dtype == torch.int64
    assert ids.min() >= 0 and ids.max() < toy.VOCAB
    assert torch.equal(ids, toy.long_ids(torch.device("cpu")))  # the same draw every call
    counts = torch.bincount(ids.flatten(), minlength=toy.VOCAB).double()
    assert (counts / ids.numel() - 1 / toy.VOCAB).abs().max() < 0.01  # uniform over 16 tokens


@pytest.mark.slow
def test_the_task_needs_positions(trained: toy.PreviousTokenModel) -> None:
    assert toy.accuracy(trained) > 0.95
    assert toy.accuracy(toy.train(use_positions=False, device="cpu")) < 0.5
    # rows 16..31 get no gradient: Adam leaves them as they started, and they carry no position
    rows = trained.positions.table.weight.detach()
    assert torch.equal(rows[16:], trained.initial_rows[16:])
    assert toy.accuracy(trained, start=16) < 0.5


@pytest.mark.slow
def test_training_is_deterministic(trained: toy.PreviousTokenModel) -> None:
    again = toy.train(use_positions=True, device="cpu")
    for (name, p), q in zip(trained.state_dict().items(), again.state_dict().values(), strict=True):
        assert torch.equal(p, q), name
    other = toy.train(use_positions=True, seed=1, device="cpu")
    assert not torch.equal(other.positions.table.weight, trained.positions.table.weight)


@pytest.mark.slow
def test_fine_tune_returns_a_trained_copy(trained: toy.PreviousTokenModel) -> None:
    before = trained.positions.table.weight.detach().clone()
    tuned = toy.fine_tune(toy.interpolate_rows(trained))
    assert torch.equal(trained.positions.table.weight, before)
    per_query = toy.long_accuracy_per_query(tuned)
    assert per_query.shape == (31,) and per_query.min() > 0.9  # interpolation, then training
    assert torch.equal(per_query, toy.long_accuracy(tuned))  # the same measure, two ways
    on_previous, on_twin = toy.on_previous_and_twin(tuned)
    assert on_previous.shape == on_twin.shape == (31,)
    assert ((on_previous >= 0) & (on_previous + on_twin <= 1 + 1e-6)).all()


def test_the_per_query_summaries() -> None:
    per_query = torch.ones(31)
    per_query[15] = 0.04  # the seam query, at position 16
    per_query[[19, 29]] = torch.tensor([0.5, 0.3])  # the queries at positions 20 and 30
    assert toy.seam_and_rest(per_query) == (pytest.approx(0.04), pytest.approx(0.3))
    assert toy.weakest_position(per_query) == 30
    assert toy.weak_positions(per_query) == [20, 30]
    assert toy.weak_positions(per_query, below=0.4) == [30]


def test_shrink_seam_keeps_the_direction_and_sets_the_length() -> None:
    copied = toy.copy_rows(_untrained())
    length = toy.random_length(_untrained())
    shrunk = toy.shrink_seam(copied, length)
    seam, original = shrunk.positions.table.weight[16].detach(), copied.positions.table.weight[16]
    assert torch.isclose(seam.norm(), length)
    assert torch.allclose(seam / seam.norm(), original / original.norm(), atol=1e-6)
    rows = _untrained().positions.table.weight.detach()[16:]
    assert torch.isclose(length, torch.stack([r.norm() for r in rows]).mean())


@pytest.mark.parametrize(
    ("call", "name"),
    [
        (lambda: _untrained().embed(torch.zeros(1, 16, dtype=torch.long), start=17), "start=17"),
        (lambda: _untrained()(torch.zeros(1, 4, dtype=torch.long), -1), "start=-1"),
        (lambda: toy.copy_rows(_untrained(use_positions=False)), "model"),
        (lambda: toy.interpolate_rows(_untrained(use_positions=False)), "model"),
        (lambda: toy.window_bias(0), "window=0"),
        (lambda: toy.window_bias(8, length=0), "length=0"),
        (lambda: toy.random_tokens(torch.Generator(), 0, "cpu"), "batch=0"),
        (lambda: toy.seam_and_rest(torch.ones(15)), "per_query.shape=(15,)"),
        (lambda: toy.shrink_seam(toy.copy_rows(_untrained()), torch.tensor(0.0)), "length="),
    ],
)
def test_bad_input_is_named(call, name: str) -> None:
    with pytest.raises(ValueError, match=re.escape(name)):
        call()


def test_a_model_without_positions_ignores_start() -> None:
    model = _untrained(use_positions=False)
    ids = torch.zeros(2, 40, dtype=torch.long)  # longer than the table: no table, no limit
    assert torch.equal(model.embed(ids, start=5), model.tokens(ids))

