"""Exact ROC AUC (ties count one half, the Mann-Whitney statistic) in O(n log n), and log loss."""

from __future__ import annotations

import numpy as np


def roc_auc(labels: np.ndarray, scores: np.ndarray) -> float:
    """AUC = (sum of positive ranks - P(P+1)/2) / (P*N), with tied scores given their mean rank."""
    labels = np.asarray(labels).astype(bool).ravel()
    scores = np.asarray(scores, dtype=np.float64).ravel()
    pos = int(labels.sum())
    neg = labels.size - pos
    if pos == 0 or neg == 0:
        return float("nan")
    order = np.argsort(scores, kind="mergesort")
    sorted_scores = scores[order]
    # start index of each run of equal scores -> mean 1-based rank of the run
    starts = np.flatnonzero(np.r_[True, sorted_scores[1:] != sorted_scores[:-1]])
    ends = np.r_[starts[1:], scores.size]
    run_rank = (starts + ends + 1) / 2.0
    ranks = np.repeat(run_rank, ends - starts)
    pos_rank_sum = ranks[labels[order]].sum()
    return float((pos_rank_sum - pos * (pos + 1) / 2.0) / (pos * neg))


def log_loss(labels: np.ndarray, probs: np.ndarray, eps: float = 1e-7) -> float:
    labels = np.asarray(labels, dtype=np.float64).ravel()
    p = np.clip(np.asarray(probs, dtype=np.float64).ravel(), eps, 1 - eps)
    return float(-np.mean(labels * np.log(p) + (1 - labels) * np.log1p(-p)))
