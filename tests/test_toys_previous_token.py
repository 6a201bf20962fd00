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



# The measurements both chapter-2 pages call (bag, maps, rows, window, interpolation, seeds)


def _bag_reference(ids: torch.Tensor) -> float:
    # the guess written out with collections.Counter: the most frequent other token, ties to the
    # smallest
    from collections import Counter

    hits = total = 0
    for seq in ids.tolist():
        for t in range(1, len(seq)):
            counts = Counter(seq[:t] + seq[t + 1 :])
            top = max(counts.values())
            guess = min(tok for tok, n in counts.items() if n == top)
            hits += guess == seq[t - 1]
            total += 1
    return hits / total


def test_the_bag_guess_by_hand_and_against_a_counter() -> None:
    # [1, 1, 2]: query 1 sees {1, 2} (tie: 1, right), query 2 sees {1, 1} (1, right) -> 2 of 2
    # [0, 3, 3, 5]: query 1 sees {0, 3, 5} (tie: 0, right), query 2 {0, 3, 5} (tie: 0, wrong: the
    # answer is 3), query 3 {0, 3, 3} (3, right) -> 2 of 3
    assert toy.bag_of_tokens_accuracy(torch.tensor([[1, 1, 2]])) == 1.0
    assert toy.bag_of_tokens_accuracy(torch.tensor([[0, 3, 3, 5]])) == pytest.approx(2 / 3)
    ids = toy.random_tokens(torch.Generator().manual_seed(7), 64, "cpu")
    assert toy.bag_of_tokens_accuracy(ids) == pytest.approx(_bag_reference(ids), abs=1e-6)


def test_the_attention_map_is_the_softmax_of_the_scaled_logits() -> None:
    model = _untrained(4)
    ids = toy.random_tokens(torch.Generator().manual_seed(8), 3, "cpu")
    for start in (0, 9):
        weights = toy.attention_map(model, ids, start)
        assert weights.shape == (3, 16, 16) and weights.dtype == torch.float32
        rows = model.positions.table.weight[start : start + 16]
        x = (model.tokens.weight[ids] + rows).detach().double()
        w = model.attention.qkv.weight.detach().double()  # (3 * DIM, DIM): W_q, W_k, W_v stacked
        q, k = x @ w[: toy.DIM].T, x @ w[toy.DIM : 2 * toy.DIM].T
        expected = torch.softmax(q @ k.transpose(1, 2) / toy.DIM**0.5, dim=-1)
        torch.testing.assert_close(weights.double(), expected, rtol=0, atol=1e-5)


def test_position_only_logits_are_the_bilinear_form_of_the_rows() -> None:
    model = _untrained(5)
    rows = model.positions.table.weight.detach().double().numpy()  # (32, DIM)
    w = model.attention.qkv.weight.detach().double().numpy()
    w_q, w_k = w[: toy.DIM], w[toy.DIM : 2 * toy.DIM]
    expected = np.array([[rows[m] @ w_q.T @ (rows[n] @ w_k.T) / np.sqrt(toy.DIM) for n in range(16)]
                         for m in range(16)])
    logits = toy.position_only_logits(model).double().numpy()
    np.testing.assert_allclose(logits, expected, atol=1e-5)
    all_rows = toy.position_only_logits(model, model.positions.table.weight.detach())
    assert all_rows.shape == (32, 32)
    np.testing.assert_allclose(all_rows[:16, :16].double().numpy(), expected, atol=1e-5)


def test_compare_maps_on_a_hand_made_map() -> None:
    position_weights = torch.tensor([[1.0, 0.0, 0.0], [0.9, 0.1, 0.0], [0.0, 0.8, 0.2]])
    weights = torch.stack([position_weights, position_weights]).clone()
    weights[1, 2] = torch.tensor([0.0, 0.5, 0.5])  # sequence 1, query 2: 0.3 less on key 1
    maps = toy.compare_maps(position_weights, weights)
    assert maps["from_positions"].tolist() == pytest.approx([0.9, 0.8])
    assert maps["map_gap"].item() == pytest.approx(0.15)  # the average moves by 0.3 / 2
    assert maps["sequence_gap"].tolist() == pytest.approx([0.0, 0.3])
    each = maps["each_on_previous"].tolist()
    assert each == [pytest.approx([0.9, 0.8]), pytest.approx([0.9, 0.5])]
    assert maps["per_sequence"].shape == (2, 2, 3)


def test_row_statistics_against_numpy() -> None:
    model = _untrained(6)
    rows = model.positions.table.weight.detach().double().numpy()
    unit = rows / np.linalg.norm(rows, axis=1, keepdims=True)

    def mean_abs_cos(block: np.ndarray) -> float:
        return np.mean([abs(block[i] @ block[j]) for i in range(16) for j in range(16) if i != j])

    stats = toy.row_statistics(model)
    assert stats["related_trained"] == pytest.approx(mean_abs_cos(unit[:16]), abs=1e-6)
    assert stats["related_untrained"] == pytest.approx(mean_abs_cos(unit[16:]), abs=1e-6)
    lengths = np.linalg.norm(rows, axis=1)
    assert stats["length_trained"] == pytest.approx(lengths[:16].mean(), abs=1e-6)
    assert stats["length_untrained"] == pytest.approx(lengths[16:].mean(), abs=1e-6)
    neighbour_cos = [unit[t] @ unit[t + 1] for t in range(15)]
    assert stats["neighbours"] == pytest.approx(np.mean(neighbour_cos), abs=1e-6)
    assert stats["neighbours_abs"] == pytest.approx(np.mean(np.abs(neighbour_cos)), abs=1e-6)
    ratio = stats["length_trained"] / stats["length_untrained"]
    assert stats["length_ratio"] == pytest.approx(ratio)
    # untrained rows are N(0, 0.02^2): length about 0.02 sqrt(DIM)
    assert stats["length_trained"] == pytest.approx(0.02 * toy.DIM**0.5, rel=0.2)


def test_each_twin_key_holds_the_row_of_the_previous_key() -> None:
    queries, twin = toy.twin_keys()
    assert queries.tolist() == [t for t in range(1, 32) if t != 16]
    rows = toy.copy_rows(_untrained()).positions.table.weight.detach()
    for t, k in zip(queries.tolist(), twin.tolist(), strict=True):
        assert k != t - 1 and abs(k - (t - 1)) == 16 and torch.equal(rows[k], rows[t - 1])


def test_a_window_that_covers_everything_changes_nothing() -> None:
    model = _untrained(2)
    copied = toy.copy_rows(model)
    wide = toy.windowed_accuracies(copied, model, window=32)  # every |m - n| < 32: no key hidden
    assert torch.equal(wide["windowed_per_query"], toy.long_accuracy_per_query(copied))
    full = toy.long_accuracy(model).mean().item()
    assert wide["control_windowed"] == wide["control_full"] == full
    narrow = toy.windowed_accuracies(copied, model)
    assert narrow["windowed_per_query"].shape == (31,)


def test_two_back_accuracy_written_out() -> None:
    model = _untrained(3)
    ids = toy.long_ids("cpu")
    with torch.no_grad():
        predictions = model(ids).argmax(-1)  # (512, 32)
    hits = [predictions[b, t].item() == ids[b, t - 2].item()
            for b in range(512) for t in range(2, 32)]
    assert toy.two_back_accuracy(model) == pytest.approx(sum(hits) / len(hits))


def test_back_weights_and_the_weight_away_from_the_band_on_hand_made_maps() -> None:
    weights = torch.zeros(12, 12)
    for t in range(12):
        weights[t, max(t - 2, 0)] = 1.0  # every query on key t - 2
    assert toy.back_weights(weights) == [0.0, 0.0, 1.0, 0.0, 0.0]
    far = toy.far_from_band(weights)
    assert far["on_later_keys"] == 0.0
    assert far["far_back"].shape == (8,) and far["far_back"].max() == 0.0
    weights[9] = 0.0
    weights[9, [0, 7, 11]] = torch.tensor([0.7, 0.2, 0.1])  # query 9: 0.7 on key 0, 0.1 after it
    far = toy.far_from_band(weights)
    assert (far["far_query"], far["far_key"]) == (9, 0)
    assert far["far_back"][9 - 4].item() == pytest.approx(0.7)
    assert far["on_later_keys"] == pytest.approx(0.1 / 8)  # one of the 8 queries 4..11


def _fake_run(**values: float) -> dict[str, float]:
    keys = ["accuracy", "position_peak", "measured_peak", "gap", "neighbours", "neighbours_abs",
            "pair_min", "pair_max", "related", "related_untrained", "interp", "two_back",
            "copied_long", "control_full", "windowed_long", "control_windowed"]
    for arm in ("random", "copied", "interp", "shrunk"):
        keys += [f"{arm}_tuned", f"{arm}_seam", f"{arm}_weakest"]
    keys += ["random_weakest_at", "shrunk_weakest_at", "shrunk_below", "random_below",
             "random_below_first", "row0_ratio"]
    return {key: values.get(key, 0.5) for key in keys}


def test_seed_summary_and_glue_values_on_made_up_runs() -> None:
    runs = [
        _fake_run(random_tuned=0.98, copied_tuned=0.97, interp_tuned=1.0, copied_seam=0.04,
                  copied_weakest=1.0, interp_weakest=0.99, interp_seam=1.0, shrunk_weakest=0.05,
                  position_peak=15),
        _fake_run(random_tuned=0.90, copied_tuned=0.934, interp_tuned=0.99, copied_seam=0.99,
                  copied_weakest=0.98, interp_weakest=0.97, interp_seam=0.96, shrunk_weakest=0.99,
                  position_peak=14),
        _fake_run(random_tuned=0.60, copied_tuned=0.95, interp_tuned=0.98, copied_seam=0.98,
                  copied_weakest=0.96, interp_weakest=1.0, interp_seam=0.95, shrunk_weakest=0.02,
                  position_peak=15),
    ]
    summary = toy.seed_summary(runs)
    assert summary["column"]["random_tuned"] == [0.98, 0.90, 0.60]
    assert summary["failed"] == 2  # the control's worst seed
    assert summary["copied_edge"] == pytest.approx([-0.01, 0.034, 0.35])
    assert summary["copied_ahead"] == 2 and summary["small_edges"] == [0.03]  # seed 2 aside
    assert summary["interp_worst"] == [0.99, 0.96, 0.95]
    assert summary["seam_repaired"] == 2 and summary["copied_no_weak"] == 2
    assert summary["shrunk_broken"] == [0, 2]
    assert summary["spread"]["random_tuned"] == pytest.approx(0.38)
    assert summary["seeds_mean"]["interp_tuned"] == pytest.approx(0.99)
    values = toy.seed_glue_values(runs)
    assert values["seed1_copied_tuned"] == 0.93 and values["seed0_position_peak"] == 15
    assert values["seed2_interp_worst"] == 0.95 and "seed0_pair_min" not in values  # UNTABLED
    assert values["seeds_seam_failed"] == 1 and values["seeds_control_failed"] == 2
    assert values["seeds_copied_edge_failed"] == 0.35
    assert values["seeds_copied_edge_min"] == 0.03
    assert values["seeds_random_tuned_min"] == 0.6 and values["seeds_random_tuned_max"] == 0.98
    assert values["seeds_shrunk_broken"] == 2 and values["seeds_shrunk_weakest_max"] == 0.05


def test_the_fine_tune_table_reads_seam_and_weakest_query() -> None:
    after = torch.ones(31)
    after[15], after[20] = 0.25, 0.5  # the seam query (position 16) and the query at position 21
    table = toy.fine_tune_table({"copied rows": (0.52, after)}).splitlines()
    assert table[0] == f"after {toy.FINE_TUNE_STEPS} steps on 32 tokens, accuracy on 32 tokens:"
    assert table[2].split() == ["copied", "rows", "0.52", f"{after.mean():.2f}", "0.25", "0.50"]


def test_fine_tuned_measures_reads_each_model() -> None:
    control, other = _untrained(1), _untrained(2)  # any models: the function only measures them
    copied, interpolated = toy.copy_rows(other), toy.interpolate_rows(other)
    measures = toy.fine_tuned_measures(control, other, copied, interpolated)
    assert torch.equal(measures["control_before"], toy.long_accuracy(control))
    assert torch.equal(measures["random"], toy.long_accuracy(other))
    # late_on_trained, by hand: the control's softmax weights of queries 16..31 on keys 0..15,
    # averaged over the 512 test sequences, summed over the keys
    ids = toy.long_ids("cpu")
    x = (control.tokens.weight[ids] + control.positions.table.weight[:32]).detach().double()
    w = control.attention.qkv.weight.detach().double()  # W_q, W_k, W_v stacked
    q, k = x @ w[: toy.DIM].T, x @ w[toy.DIM : 2 * toy.DIM].T
    weights = torch.softmax(q @ k.transpose(1, 2) / toy.DIM**0.5, dim=-1).mean(0)  # (32, 32)
    expected = weights[16:, :16].sum(-1)
    torch.testing.assert_close(measures["late_on_trained"].double(), expected, rtol=0, atol=1e-5)
    on_previous, on_twin = toy.on_previous_and_twin(toy.copy_rows(other))
    assert torch.equal(measures["copied_on_previous"], on_previous)
    assert torch.equal(measures["copied_on_twin"], on_twin)


@pytest.mark.slow
def test_seed_runs_trains_each_seed(trained: toy.PreviousTokenModel) -> None:
    (run,) = toy.seed_runs([0], "cpu")
    assert run["accuracy"] == toy.accuracy(trained)  # seed 0 is the model trained with the defaults
    assert run["position_peak"] == 15 and run["interp_tuned"] > 0.9


@pytest.mark.parametrize(
    ("call", "name"),
    [
        (lambda: toy.bag_of_tokens_accuracy(torch.zeros(5, dtype=torch.long)),
         "token_ids.shape=(5,)"),
        (lambda: toy.attention_map(_untrained(), torch.zeros(2, 4)), "dtype=torch.float32"),
        (lambda: toy.position_only_logits(_untrained(), torch.zeros(4, 3)), "rows.shape=(4, 3)"),
        (lambda: toy.position_only_logits(_untrained(use_positions=False)), "model"),
        (lambda: toy.compare_maps(torch.zeros(3, 3), torch.zeros(2, 4, 4)),
         "weights.shape=(2, 4, 4)"),
        (lambda: toy.back_weights(torch.zeros(3, 4)), "weights.shape=(3, 4)"),
        (lambda: toy.back_weights(torch.zeros(6, 6), first_query=2), "first_query=2"),
        (lambda: toy.seed_runs([], "cpu"), "seeds=[]"),
        (lambda: toy.seed_runs([-1], "cpu"), "seeds[0]=-1"),
        (lambda: toy.seed_summary([]), "runs=[]"),
    ],
)
def test_bad_measurement_input_is_named(call, name: str) -> None:
    with pytest.raises(ValueError, match=re.escape(name)):
        call()
