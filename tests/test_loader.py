import os
import signal
import subprocess
import sys
import threading
import time

import numpy as np
import pytest
import torch

from dlrmkit.data.loader import BatchLoader, Prefetcher, batch_bounds, epoch_order
from dlrmkit.data.split_binary import SplitBinaryWriter, open_dataset
from dlrmkit.errors import DatasetError

ROWS, BATCH = 1000, 64  # 15 full batches and one of 40


def make_dataset(out, rows=ROWS, bad_row=None):
    """Table 0 holds the row index, so every batch says which rows it carries."""
    rng = np.random.default_rng(0)
    writer = SplitBinaryWriter(str(out), 2, [100_000, 7])
    ids = np.stack([np.arange(rows), rng.integers(0, 7, rows)], axis=1)
    if bad_row is not None:
        ids[bad_row, 1] = 7  # == cardinality
    dense = np.stack([np.arange(rows) % 1000, -np.arange(rows) % 1000], axis=1).astype(np.float32)
    writer.append("train", dense, ids, np.arange(rows) % 3 == 0)
    writer.append("test", dense[:10], ids[:10] % 7, np.zeros(10, bool))
    writer.finish()
    return open_dataset(str(out))[1]


@pytest.fixture
def dataset(tmp_path):
    return make_dataset(tmp_path / "ds")


def rows_of(batches):
    return [b.ids[:, 0].tolist() for b in batches]


def test_batch_bounds():
    assert batch_bounds(10, 4, drop_last=False) == [(0, 4), (4, 8), (8, 10)]
    assert batch_bounds(10, 4, drop_last=True) == [(0, 4), (4, 8)]
    assert batch_bounds(8, 4, drop_last=False) == [(0, 4), (4, 8)]
    assert batch_bounds(3, 4, drop_last=True) == []


def test_epoch_order_is_seeded_permutation():
    a = epoch_order(50, epoch=0, seed=1, shuffle=True)
    assert sorted(a.tolist()) == list(range(50))
    assert a.tolist() != list(range(50))
    np.testing.assert_array_equal(a, epoch_order(50, epoch=0, seed=1, shuffle=True))
    assert a.tolist() != epoch_order(50, epoch=1, seed=1, shuffle=True).tolist()
    assert a.tolist() != epoch_order(50, epoch=0, seed=2, shuffle=True).tolist()
    assert epoch_order(50, epoch=3, seed=1, shuffle=False).tolist() == list(range(50))


@pytest.mark.parametrize("prefetch", [0, 1, 2])
def test_unshuffled_epoch_yields_all_rows_in_order(dataset, prefetch):
    loader = BatchLoader(dataset, BATCH, shuffle=False, prefetch=prefetch)
    assert len(loader) == 16
    for epoch in (0, 1):
        batches = list(loader.epoch(epoch))
        assert [len(b) for b in batches] == [64] * 15 + [40]
        assert sum(rows_of(batches), []) == list(range(ROWS))
    b = batches[3]
    assert b.dense.dtype == torch.float32 and b.dense.shape == (64, 2)
    assert b.ids.dtype == torch.int64 and b.ids.shape == (64, 2)
    assert b.labels.dtype == torch.float32 and b.labels.shape == (64,)
    rows = np.arange(3 * 64, 4 * 64)
    np.testing.assert_array_equal(b.labels.numpy(), (rows % 3 == 0).astype(np.float32))
    np.testing.assert_array_equal(b.dense[:, 0].numpy(), rows.astype(np.float32))


def test_drop_last(dataset):
    loader = BatchLoader(dataset, BATCH, shuffle=True, seed=3, drop_last=True)
    batches = list(loader.epoch(0))
    assert len(batches) == 15 and all(len(b) == 64 for b in batches)
    assert sorted(sum(rows_of(batches), [])) == list(range(15 * 64))


def test_shuffle_is_seeded_permutation_of_batches(dataset):
    loader = BatchLoader(dataset, BATCH, shuffle=True, seed=5)
    orders = []
    for epoch in (0, 1, 2):
        batches = list(loader.epoch(epoch))
        rows = rows_of(batches)
        # every row exactly once per epoch
        assert sorted(sum(rows, [])) == list(range(ROWS))
        # batches are whole contiguous row ranges of the unshuffled epoch
        for r in rows:
            assert r[0] % BATCH == 0 and r == list(range(r[0], r[0] + len(r)))
        orders.append([r[0] // BATCH for r in rows])
    assert orders[0] != list(range(16))
    assert orders[0] != orders[1] and orders[1] != orders[2]
    # the same seed gives the same order; another seed another order
    again = BatchLoader(dataset, BATCH, shuffle=True, seed=5)
    assert [r[0] // BATCH for r in rows_of(again.epoch(1))] == orders[1]
    other = BatchLoader(dataset, BATCH, shuffle=True, seed=6)
    assert [r[0] // BATCH for r in rows_of(other.epoch(1))] != orders[1]


@pytest.mark.parametrize("shuffle", [False, True])
@pytest.mark.parametrize("start", [0, 1, 7, 15, 16])
def test_resume_yields_tail_of_epoch(dataset, shuffle, start):
    loader = BatchLoader(dataset, BATCH, shuffle=shuffle, seed=11)
    full = list(loader.epoch(2))
    tail = list(loader.epoch(2, start))
    assert len(tail) == 16 - start
    for a, b in zip(full[start:], tail):
        assert torch.equal(a.ids, b.ids) and torch.equal(a.dense, b.dense) and torch.equal(a.labels, b.labels)


# ---- the prefetch thread ----------------------------------------------------------------------------


def test_error_in_prefetch_thread_reaches_consumer(tmp_path):
    ds = make_dataset(tmp_path / "bad", bad_row=700)  # in batch 10
    loader = BatchLoader(ds, BATCH, shuffle=False, prefetch=2)
    seen = []
    with pytest.raises(DatasetError) as info:
        for batch in loader.epoch(0):
            seen.append(batch)
    assert "row 700" in str(info.value) and "cat_1.bin" in str(info.value)
    assert len(seen) == 10  # every batch before the bad one was delivered


def test_prefetcher_reraises_source_exception():
    class Boom(Exception):
        pass

    def source():
        yield 1
        yield 2
        raise Boom("from the worker thread")

    fetcher = Prefetcher(source(), depth=1)
    got = []
    with pytest.raises(Boom, match="from the worker thread"):
        for item in fetcher:
            got.append(item)
    assert got == [1, 2]
    assert fetcher.thread.ident != threading.get_ident()


def prefetch_threads():
    return {t for t in threading.enumerate() if t.name.endswith("(_work)") and t.is_alive()}


def wait_dead(threads, timeout=3.0):
    deadline = time.monotonic() + timeout
    for t in threads:
        t.join(max(deadline - time.monotonic(), 0))
    return [t for t in threads if t.is_alive()]


def test_prefetch_thread_stops_when_consumer_closes_early(dataset):
    loader = BatchLoader(dataset, 8, shuffle=False, prefetch=2)  # 125 batches
    before = prefetch_threads()
    gen = loader.epoch(0)
    first = next(gen)
    assert first.ids[:, 0].tolist() == list(range(8))
    started = prefetch_threads() - before
    assert len(started) == 1
    gen.close()
    assert wait_dead(started) == []


def test_prefetch_thread_stops_when_consumer_breaks(dataset):
    loader = BatchLoader(dataset, 8, shuffle=True, prefetch=3)
    before = prefetch_threads()
    gen = loader.epoch(0)
    for i, _ in enumerate(gen):
        if i == 4:
            break
    started = prefetch_threads() - before
    assert len(started) == 1
    del gen  # the abandoned generator is closed, which stops its thread
    assert wait_dead(started) == []


def test_prefetcher_close_stops_worker_blocked_on_full_queue():
    produced = []

    def source():
        for i in range(1000):
            produced.append(i)
            yield i

    fetcher = Prefetcher(source(), depth=2)
    assert next(fetcher) == 0
    fetcher.close()
    assert wait_dead([fetcher.thread]) == []
    assert len(produced) < 10  # it stopped instead of draining the source


def test_prefetch_thread_stops_when_consumer_stops_near_end_of_epoch(dataset):
    loader = BatchLoader(dataset, BATCH, shuffle=False, prefetch=2)  # 16 batches
    before = prefetch_threads()
    gen = loader.epoch(0)
    for i, _ in enumerate(gen):
        if i == 13:  # batches 14 and 15 are already queued; the source is exhausted
            break
    time.sleep(0.3)
    started = prefetch_threads() - before
    assert len(started) == 1
    gen.close()
    assert wait_dead(started, timeout=1.0) == []


# ---- a dataset file truncated while it is read ---------------------------------------------------
def stopped(pid: int) -> bool:
    with open(f"/proc/{pid}/stat") as f:
        return f.read().rsplit(")", 1)[1].split()[0] == "T"


def test_a_file_truncated_while_train_reads_it_is_one_line(dataset_copy, tmp_path):
    """train SIGSTOPs itself after step 2 (DLRMKIT_FAULT), the numerical file is cut to its first
    512 rows, and train continues: its next read past them ends the command with one line naming
    the file and both sizes, exit 2 (the files were memory-mapped: SIGBUS, exit -7, no message)."""
    target = dataset_copy / "train" / "numerical.bin"
    size = target.stat().st_size
    args = [sys.executable, "-m", "dlrmkit", "train", "--data", str(dataset_copy), "--no-progress",
            "--batch-size", "64", "--max-steps", "200", "--run-dir", str(tmp_path / "run")]  # fmt: skip
    env = dict(os.environ, OMP_NUM_THREADS="1", PYTHONUNBUFFERED="1", DLRMKIT_FAULT="train:step-2@:SIGSTOP")
    proc = subprocess.Popen(args, env=env, cwd=tmp_path, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True)
    try:
        deadline = time.monotonic() + 120
        while proc.poll() is None and not stopped(proc.pid) and time.monotonic() < deadline:
            time.sleep(0.02)
        assert proc.poll() is None and stopped(proc.pid), (
            proc.stderr.read() if proc.poll() is not None else "not stopped"
        )
        os.truncate(target, 512 * 8)  # 4 float16 features a row
        proc.send_signal(signal.SIGCONT)
        err = proc.communicate(timeout=120)[1]
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
    assert proc.returncode == 2, (proc.returncode, err)
    lines = err.strip().splitlines()
    assert lines == [
        f"dlrmkit train: error: train/numerical.bin: the file shrank to 4,096 bytes while it was read "
        f"(it held {size:,} when opened)"
    ], err


def test_small_batches_are_read_inline_and_large_ones_in_a_thread(dataset, monkeypatch):
    from dlrmkit.data import loader as loader_module

    row = loader_module.row_bytes(dataset)
    columns = [dataset.label, dataset.numerical, *dataset.categorical]
    on_disk = sum(os.path.getsize(os.path.join(dataset.spec.base_directory, f)) for c in columns for f in c.files)
    assert row * len(dataset) == on_disk
    monkeypatch.setattr(loader_module, "PREFETCH_BYTES", 16 * row)
    before = prefetch_threads()
    small, large = BatchLoader(dataset, 15, shuffle=False), BatchLoader(dataset, 16, shuffle=False)
    assert (small.prefetch, large.prefetch, BatchLoader(dataset, 15, prefetch=1).prefetch) == (0, 2, 1)
    inline = small.epoch(0)
    assert next(inline).ids[:, 0].tolist() == list(range(15)) and prefetch_threads() == before
    ahead = large.epoch(0)
    assert next(ahead).ids[:, 0].tolist() == list(range(16)) and len(prefetch_threads() - before) == 1
    inline.close()
    ahead.close()
