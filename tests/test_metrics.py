import math

import numpy as np
import pytest
from sklearn.metrics import log_loss as sk_log_loss
from sklearn.metrics import roc_auc_score

from dlrmkit.metrics import log_loss, roc_auc


@pytest.mark.parametrize("n", [2, 7, 100, 5000, 50_000])
@pytest.mark.parametrize("seed", [0, 1, 2])
def test_roc_auc_matches_sklearn_with_many_ties(n, seed):
    rng = np.random.default_rng([seed, n])
    labels = rng.random(n) < 0.3
    labels[0], labels[-1] = True, False  # both classes present
    # scores correlated with the label, rounded to 1 decimal: only ~11 distinct values
    scores = np.clip(rng.normal(0.5 + 0.2 * labels, 0.25), 0, 1).round(1)
    assert len(np.unique(scores)) < n or n <= 11
    assert roc_auc(labels, scores) == pytest.approx(roc_auc_score(labels, scores), abs=1e-12)


@pytest.mark.parametrize("seed", range(5))
def test_roc_auc_matches_sklearn_integer_scores_and_float32(seed):
    rng = np.random.default_rng(seed)
    labels = rng.integers(0, 2, 3000).astype(np.float32)
    scores = rng.integers(0, 4, 3000).astype(np.float32)  # 4 distinct values: heavy ties
    assert roc_auc(labels, scores) == pytest.approx(roc_auc_score(labels, scores), abs=1e-12)


def test_roc_auc_without_ties_matches_sklearn():
    rng = np.random.default_rng(7)
    labels = rng.random(1000) < 0.5
    scores = rng.random(1000)
    assert roc_auc(labels, scores) == pytest.approx(roc_auc_score(labels, scores), abs=1e-12)


def test_roc_auc_perfect_and_inverted():
    labels = np.array([0, 0, 1, 1])
    assert roc_auc(labels, np.array([0.1, 0.2, 0.8, 0.9])) == 1.0
    assert roc_auc(labels, np.array([0.9, 0.8, 0.2, 0.1])) == 0.0


def test_roc_auc_hand_computed_with_ties():
    # pairs (pos, neg): (0.5 vs 0.5)=1/2, (0.5 vs 0.1)=1, (0.9 vs 0.5)=1, (0.9 vs 0.1)=1 -> 3.5/4
    labels = np.array([1, 0, 1, 0])
    scores = np.array([0.5, 0.5, 0.9, 0.1])
    assert roc_auc(labels, scores) == pytest.approx(3.5 / 4)


@pytest.mark.parametrize("n", [2, 10, 1001])
def test_roc_auc_all_ties_is_one_half(n):
    labels = np.arange(n) % 2 == 0
    assert roc_auc(labels, np.full(n, 0.3)) == 0.5


@pytest.mark.parametrize("label", [0, 1])
def test_roc_auc_single_class_is_nan(label):
    assert math.isnan(roc_auc(np.full(10, label), np.linspace(0, 1, 10)))


def test_roc_auc_empty_is_nan():
    assert math.isnan(roc_auc(np.array([]), np.array([])))


@pytest.mark.parametrize("seed", range(4))
def test_log_loss_matches_sklearn(seed):
    rng = np.random.default_rng(seed)
    labels = rng.random(2000) < 0.25
    probs = rng.uniform(0.01, 0.99, 2000)
    assert log_loss(labels, probs) == pytest.approx(sk_log_loss(labels, probs, labels=[0, 1]), rel=1e-12)


def test_log_loss_hand_value_and_clipping():
    assert log_loss(np.array([1, 0]), np.array([0.8, 0.4])) == pytest.approx(-(math.log(0.8) + math.log(0.6)) / 2)
    # probabilities of exactly 0 and 1 are clipped, so a confident mistake is large but finite
    worst = log_loss(np.array([1.0, 0.0]), np.array([0.0, 1.0]))
    assert math.isfinite(worst)
    assert worst == pytest.approx(-math.log(1e-7), rel=1e-6)
    assert log_loss(np.array([1.0, 0.0]), np.array([1.0, 0.0])) < 1e-6


def test_reliability_of_a_diverged_model_warns_nothing():
    """NaN probabilities (a model diverged by the step before an evaluation): the evaluation's
    calibration error is NaN (null in the log), with no numpy warning on screen."""
    import warnings

    from dlrmkit.train.calibration import expected_calibration_error, reliability

    probs, labels = np.array([0.2, np.nan, 0.7]), np.array([0.0, 1.0, 1.0])
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        reliability(labels, probs)
        assert math.isnan(expected_calibration_error(labels, probs))
