"""Score raw rows with a trained checkpoint: read rows in the format the dataset was built from
(Criteo TSV for `preprocess criteo`, the CSV/TSV/Parquet columns for `transcode`), encode them
with the dataset's stored vocabulary (unseen categories -> the rare id 0) and transform, and
write click probabilities. Streaming: the input is parsed block by block with the same parser as
preprocessing (bad rows counted by reason, first positions reported; `--strict` stops at the
first), so memory never grows with the input.

`--no-label` reads rows without the label column: Criteo rows of 39 fields, or CSV/TSV/Parquet
rows that lack the dataset's label column (a label column present is then ignored); the output has
no label column. `--keep-columns` carries raw columns of CSV/TSV/Parquet rows (a request's own
key, such as Avazu's `id`) into the output beside each probability, as read, so the scores join
back to the requests. Nothing is written until the first rows have been read and scored, so input that
fails at once (a missing column, no valid row) leaves standard output empty; --output is written
whole or not at all."""

from __future__ import annotations

import argparse
import os
import sys
from dataclasses import dataclass, field
from typing import Any, Iterator, TextIO

import numpy as np

from dlrmkit import cli_types as ct
from dlrmkit.errors import DlrmkitError
from dlrmkit.options import add_options, option


@dataclass
class PredictOptions:
    checkpoint: str = option(help="checkpoint folder, or a checkpoint dir with 'latest'", parse=ct.path, required=True)
    input: str = option(
        help="raw rows: Criteo TSV (plain or .gz) or the CSV/TSV/Parquet a transcoded dataset came from",
        parse=ct.path,
        required=True,
    )
    output: str | None = option(
        None,
        "CSV to write (columns row[,kept columns][,label],probability); default: standard output",
        parse=ct.path,
    )
    data: str | None = option(
        None,
        "dataset folder holding the vocabulary (default: the data path the checkpoint was trained on)",
        parse=ct.path,
    )
    batch_size: int = option(16384, "rows per forward pass (default {default})", parse=ct.batch_size)
    no_label: bool = option(
        False,
        "rows without the label column (Criteo: 39 fields; CSV/TSV/Parquet: the dataset's label column absent)",
    )
    delimiter: str | None = option(
        None,
        "CSV inputs: field delimiter (default: transcode's --delimiter, else tab for .tsv, else comma)",
        parse=ct.single_char,
    )
    columns: str | None = option(
        None,
        "CSV inputs without a header line: the column names, a,b,c (default: those transcode was given "
        "with --no-header, less the label with --no-label)",
        parse=ct.names,
    )
    keep_columns: str | None = option(
        None,
        "CSV/TSV/Parquet inputs: raw columns to write beside each probability, as read, a,b (e.g. a request's id, "
        "to join the scores back; not for Criteo TSV, whose fields have no names)",
        parse=ct.names,
        metavar="COLS",
    )
    strict: bool = option(False, "stop at the first bad row (exit code 2)")


def add_arguments(p: argparse.ArgumentParser) -> None:
    add_options(p, PredictOptions)


@dataclass
class Scored:
    """One batch of scored rows: input positions (1-based), labels when the input has them,
    probabilities, and the --keep-columns values (text), one array per column."""

    rows: np.ndarray
    labels: np.ndarray | None
    probs: np.ndarray
    kept: list[Any] = field(default_factory=list)


@dataclass
class PredictReport:
    rows_read: int = 0
    rows_scored: int = 0
    skipped: dict[str, int] = field(default_factory=dict)
    empty_lines: int = 0  # of a CSV/TSV input: skipped, not rows
    escaped: int = 0  # --keep-columns values that are not UTF-8, written with \xNN escapes
    long_values: dict[str, int] = field(default_factory=dict)  # column -> rows whose value was read as its key
    first_bad_rows: list[str] = field(default_factory=list)
    unlabeled_shaped: int = 0  # rows of blocks with no valid row that have a label-less row's 39 fields

    def no_valid_rows(self, path: str, no_label: bool) -> DlrmkitError:
        """The error when nothing was scored: the counts by reason, the first bad row, and the
        --no-label hint when every row has the fields of a row without its label."""
        n_bad = sum(self.skipped.values())
        reasons = ", ".join(f"{k} {v:,}" for k, v in self.skipped.items() if v)
        why = f" ({n_bad:,} bad rows: {reasons}; first: {self.first_bad_rows[0]})" if self.first_bad_rows else ""
        hint = ""
        if not no_label and self.rows_read and self.unlabeled_shaped == self.rows_read == n_bad:
            hint = "; every row has 39 fields, as rows without the label column do: add --no-label"
        return DlrmkitError(f"--input {path}: no valid rows{why or ' (no rows at all)'}{hint}")


def dataset_dir(checkpoint: str, data: str | None) -> str:
    """--data, else the data path in the checkpoint's recorded train config."""
    if data:
        return data
    from dlrmkit.checkpoint.save_load import read_manifest, resolve_checkpoint
    from dlrmkit.train.blend import is_blend, read_blend

    if is_blend(checkpoint):  # its first member's
        checkpoint = read_blend(checkpoint).folders[0]
    recorded = read_manifest(resolve_checkpoint(checkpoint)).get("train_config", {}).get("data")  # text or None
    if not recorded:
        raise DlrmkitError(f"{checkpoint}: the checkpoint records no dataset; pass --data DIR")
    if not os.path.isdir(recorded):
        raise DlrmkitError(
            f"{recorded}: the dataset the checkpoint was trained on is not there "
            f"(recorded relative to the training run's folder?); pass --data DIR"
        )
    return recorded


def _criteo_batches(
    path: str, vocab: Any, no_label: bool, strict: bool, report: PredictReport
) -> Iterator[tuple[np.ndarray, np.ndarray | None, np.ndarray, np.ndarray, list[Any]]]:
    """(rows, labels, dense float16, ids int64, no kept columns) per block of a Criteo TSV, via
    criteo.parse_block."""
    from dlrmkit.data.criteo_tsv import NUM_CAT, REASONS, Bad, Task, check_compression, iter_blocks
    from dlrmkit.data.criteo_tsv import numerical_matrix, parse_block
    from dlrmkit.untrusted import check_regular_input

    check_regular_input(path, "--input")
    check_compression(path)
    task = Task(0, path, 0, None if path.lower().endswith(".gz") else os.path.getsize(path), False)
    tables = [vocab.id_table(t) for t in range(NUM_CAT)]
    bad, line0 = Bad(), 1
    for block in iter_blocks(task):
        if no_label:  # give every line a dummy label field so the one parser applies unchanged
            block = b"0\t" + block[:-1].replace(b"\n", b"\n0\t") + b"\n"
        seen = sum(bad.counts.values())
        p = parse_block(block, bad, line0)
        if strict and sum(bad.counts.values()) > seen:
            line, reason, detail = next(b for b in bad.first if b[0] >= line0)
            raise DlrmkitError(f"{path}:{line}: bad row ({reason}: {detail}); stopped because of --strict")
        rows = line0 + p.valid
        line0 += p.lines
        if not len(rows) and not no_label:  # cheap, and only while nothing is valid: for the --no-label hint
            report.unlabeled_shaped += unlabeled_shaped(block)
        report.rows_read += p.lines
        if len(rows):
            ids = np.stack([vocab.encode_column(t, p.cats[t], tables[t]) for t in range(NUM_CAT)], axis=1)
            yield rows, None if no_label else p.labels, numerical_matrix(p.ints), ids, []
    report.skipped = {r: bad.counts[r] for r in REASONS}
    report.first_bad_rows = [f"{path}:{line}: {reason} ({detail})" for line, reason, detail in bad.first]


def unlabeled_shaped(block: bytes) -> int:
    """Lines of a block of Criteo TSV with exactly 39 fields (38 tabs), counted without a loop."""
    from dlrmkit.data.criteo_tsv import NUM_CAT, NUM_INT

    raw = np.frombuffer(block, np.uint8)
    ends = np.flatnonzero(raw == ord("\n"))
    tabs = np.concatenate(([0], np.cumsum(raw == ord("\t"))[ends]))
    return int((np.diff(tabs) == NUM_INT + NUM_CAT - 1).sum())


def _table_batches(
    path: str, vocab: Any, meta: dict[str, Any], stored_as: Any, args: argparse.Namespace, report: PredictReport
) -> Iterator[tuple[np.ndarray, np.ndarray | None, np.ndarray, np.ndarray, list[Any]]]:
    """Same for the CSV/TSV/Parquet input of a transcoded dataset, via transcode.iter_batches/clean,
    with the --keep-columns values of the rows as text (Arrow string arrays)."""
    from dlrmkit.data.transcode import Report, TranscodeOptions, clean, iter_batches
    from dlrmkit.untrusted import check_regular_input

    check_regular_input(path, "--input")
    columns = [c for c in (args.columns or "").split(",") if c] or _recorded_columns(meta, args.no_label)
    opts = TranscodeOptions(
        inputs=[path],
        out="",
        label=None if args.no_label else meta["label"],
        numerical=list(meta.get("numerical_columns") or []),
        categorical=list(meta.get("categorical_columns") or []),
        delimiter=args.delimiter or _recorded_delimiter(meta),
        header=columns is None,
        columns=columns,
        log=str(meta.get("numerical_transform", "")).startswith("missing/negative"),
        numerical_dtype=str(stored_as),  # out of range as the dataset's rows were
        missing_label_hint="; rows without the label column: add --no-label",
        label_values=_label_values(meta, path),
        keep=kept_columns(args),
        long_value_bytes=vocab.long_value_bytes(),
    )
    tr = Report()
    tables = [vocab.id_table(t) for t in range(len(opts.categorical))]
    seen = 0
    for t, rows in iter_batches(opts, path, tr):
        rows_out: list[np.ndarray] = []
        kept_out: list[list[Any]] = []
        labels, dense, cats = clean(opts, t, tr, path, rows, rows_out, kept_out)
        if args.strict and sum(tr.skipped.values()) > seen:
            raise DlrmkitError(f"{tr.first[0] if tr.first else path}: bad row; stopped because of --strict")
        if len(labels):
            ids = (
                np.stack([vocab.encode_column(k, c, tables[k]) for k, c in enumerate(cats)], axis=1)
                if cats
                else np.zeros((len(labels), 0), np.int64)
            )
            yield rows_out[0], None if args.no_label else labels, dense, ids, kept_out[0]
    if args.strict and sum(tr.skipped.values()) > seen:
        raise DlrmkitError(f"{tr.first[0] if tr.first else path}: bad row; stopped because of --strict")
    report.rows_read, report.skipped, report.first_bad_rows = tr.read, dict(tr.skipped), list(tr.first)
    report.empty_lines, report.escaped, report.long_values = tr.empty_lines, tr.escaped, dict(tr.long_values)


def kept_columns(args: argparse.Namespace) -> list[str]:
    """The --keep-columns names, each once and none an output column of predict's own (row,
    probability, and label where the output has it): the output's header names every column once."""
    names = [c.strip() for c in (getattr(args, "keep_columns", None) or "").split(",") if c.strip()]
    twice = next((c for c in names if names.count(c) > 1), None)
    if twice is not None:
        raise DlrmkitError(f"--keep-columns: {twice!r:.80} is named twice")
    own = ["row", *([] if args.no_label else ["label"]), "probability"]
    clash = next((c for c in names if c in own), None)
    if clash is not None:
        raise DlrmkitError(
            f"--keep-columns: {clash!r} is a column predict writes itself ({', '.join(own)}); its scores would "
            f"have two columns of that name"
        )
    return names


def _check_columns_meta(meta: dict[str, Any], spec: Any, vocab: Any, where: str) -> None:
    """A transcoded dataset's record of its raw columns, which say how a raw row becomes the
    model's input: the label a name, each feature's column named once, as many numerical columns
    as the dataset has numerical features and the categorical ones those of its vocabulary, in
    its order (a list that disagrees would feed one column to several tables, or leave one out)."""
    label, num, cat = meta.get("label"), meta.get("numerical_columns"), meta.get("categorical_columns")
    if not isinstance(label, str) or not label:
        raise DlrmkitError(f"{where}: metadata.label must name the label column, not {label!r:.80}")
    for key, names in (("numerical_columns", num), ("categorical_columns", cat)):
        if not isinstance(names, list) or not all(isinstance(n, str) and n for n in names):
            raise DlrmkitError(f"{where}: metadata.{key} must be a list of column names, not {names!r:.80}")
    if len(num) != len(spec.numerical_names):
        raise DlrmkitError(
            f"{where}: metadata.numerical_columns names {len(num)} column(s), the dataset has "
            f"{len(spec.numerical_names)} numerical feature(s)"
        )
    if cat != vocab.columns:
        raise DlrmkitError(
            f"{where}: metadata.categorical_columns {cat!r:.80} are not its vocabulary's columns {vocab.columns!r:.80}"
        )
    every = [label, *num, *cat]
    twice = next((n for n in every if every.count(n) > 1), None)
    if twice is not None:
        raise DlrmkitError(f"{where}: metadata names column {twice!r:.80} twice (label, numerical and categorical)")


def _recorded_columns(meta: dict[str, Any], no_label: bool) -> list[str] | None:
    """The column names transcode was given for files without a header line (--no-header
    --columns), from the dataset's metadata, the label's left out with --no-label; None: the files
    had a header line."""
    v = meta.get("columns")
    if v is None:
        return None
    if not (isinstance(v, list) and v and all(isinstance(x, str) and x for x in v) and len(set(v)) == len(v)):
        raise DlrmkitError(f"feature_spec.yaml: metadata.columns must be a list of column names, not {v!r:.80}")
    return [c for c in v if not (no_label and c == meta.get("label"))]


def _recorded_delimiter(meta: dict[str, Any]) -> str | None:
    """The field delimiter transcode was given (--delimiter), from the dataset's metadata; None: none given."""
    v = meta.get("delimiter")
    if v is None:
        return None
    if not (isinstance(v, str) and len(v) == 1 and v.isascii() and v not in '"\r\n'):
        raise DlrmkitError(f"feature_spec.yaml: metadata.delimiter must be one character, not {v!r:.80}")
    return v


def _label_values(meta: dict[str, Any], path: str) -> tuple[str, str] | None:
    """The label's two values transcode read as 0 and 1 (--label-values), from the dataset's metadata."""
    v = meta.get("label_values")
    if v is None:
        return None
    if not (isinstance(v, list) and len(v) == 2 and all(isinstance(x, str) and x for x in v) and v[0] != v[1]):
        raise DlrmkitError(f"feature_spec.yaml: metadata.label_values must be two different values, not {v!r}")
    return v[0], v[1]


def score(checkpoint: str, path: str, args: argparse.Namespace, report: PredictReport) -> Iterator[Scored]:
    """Scored batches of `path`, in input order."""
    import torch

    from dlrmkit.data.encoder import Vocabulary
    from dlrmkit.checkpoint.save_load import check_bags
    from dlrmkit.data.numerical_buckets import reads
    from dlrmkit.data.feature_spec import FeatureSpec
    from dlrmkit.checkpoint.save_load import load_single_process_model
    from dlrmkit.train.blend import is_blend, load_members, mean_logits, read_blend

    data = dataset_dir(checkpoint, getattr(args, "data", None))
    spec = FeatureSpec.from_yaml(data)
    meta = spec.metadata or {}
    stored_as = spec.numerical_dtype
    generator = meta.get("generator", "")
    if not isinstance(generator, str) or not generator.startswith(("dlrmkit preprocess criteo", "dlrmkit transcode")):
        raise DlrmkitError(
            f"{data}: made by {str(generator or 'unknown')!r:.80}, not by preprocess/transcode, so there is "
            f"no raw row format to read"
        )
    criteo = generator.startswith("dlrmkit preprocess criteo")
    if criteo and getattr(args, "keep_columns", None):
        raise DlrmkitError(
            f"--keep-columns: {data} was made from Criteo TSV rows, whose fields have no names to keep; "
            f"it applies to the CSV/TSV/Parquet rows of a transcoded dataset"
        )
    kept_columns(args)  # before the models are loaded
    vocab = Vocabulary.load(data)

    def check(cfg: Any) -> None:  # before the model is built
        if not reads(cfg, vocab.cardinalities):
            raise DlrmkitError(
                f"{checkpoint}: model tables {cfg.table_sizes} do not match the vocabulary of {data} "
                f"({vocab.cardinalities}); pass the --data the model was trained on"
            )

    b = read_blend(checkpoint) if is_blend(checkpoint) else None
    folders = b.folders if b is not None else [checkpoint]
    check_trained_on(folders, data, bool(getattr(args, "data", None)), spec, vocab)
    for folder in folders:  # raw rows: the dataset's bags, one id each
        check_bags(folder, data, spec.categorical_names, spec.hotness)
    if b is not None:  # its members' logits, weighted, times its temperature's 1/T
        models, weights, scale = load_members(b, check), b.weights, b.scale
    else:
        models, weights, scale = [load_single_process_model(checkpoint, check)], [1], 1.0
    for model, _ in models:
        model.eval()
    if criteo:
        source = _criteo_batches(path, vocab, args.no_label, args.strict, report)
    else:
        _check_columns_meta(meta, spec, vocab, os.path.join(data, "feature_spec.yaml"))
        source = _table_batches(path, vocab, meta, stored_as, args, report)
    with torch.no_grad():
        for rows, labels, dense, ids, kept in source:
            ids = np.asarray(ids, dtype=np.int64)
            views = [model_ids(cfg, ids, dense, stored_as) for _, cfg in models]
            for lo in range(0, len(rows), args.batch_size):
                sl = slice(lo, lo + args.batch_size)
                x = torch.from_numpy(np.asarray(dense[sl], dtype=np.float32))
                z = [model(x, torch.from_numpy(v[sl])).double().numpy() for (model, _), v in zip(models, views)]
                probs = torch.sigmoid(torch.from_numpy(scale * mean_logits(z, weights)).float()).numpy()
                if np.isnan(probs).any():  # the rows are checked finite: the model's weights or statistics are not
                    raise DlrmkitError(
                        f"{checkpoint}: the model scores input row {rows[sl][np.isnan(probs)][0]} as NaN (its "
                        f"manifest.json's model_config or its weights are not a trained model's); refused"
                    )
                report.rows_scored += len(probs)
                kept_here = [k.slice(lo, len(probs)) for k in kept]
                yield Scored(rows[sl], None if labels is None else labels[sl], probs, kept_here)


def check_trained_on(folders: list[str], data: str, given: bool, spec: Any, vocab: Any) -> None:
    """The vocabulary that encodes the rows is the one each model (a blend's every member) was
    trained with, as its manifest records it (a folder of the same path on another machine, or
    the dataset made again from other rows, numbers the values otherwise): its fingerprint
    (dlrmkit.data.fingerprint.vocabulary_fingerprint), so a dataset made again from the same rows
    passes; a checkpoint saved before that was recorded: the whole dataset's fingerprint, where
    `data` is the path it records rather than one given (--data); one that records neither: only
    the tables' sizes are checked against the vocabulary, as before."""
    from dlrmkit.checkpoint.save_load import read_manifest, resolve_checkpoint
    from dlrmkit.data.fingerprint import dataset_fingerprint, vocabulary_fingerprint

    where = f"--data {data}" if given else f"{data}, the dataset path it records,"
    ours: dict[str, str] = {}
    for folder in folders:
        recorded = read_manifest(resolve_checkpoint(folder)).get("dataset") or {}
        key = "vocabulary" if "vocabulary" in recorded else "fingerprint" if "fingerprint" in recorded and not given else None
        if key is None:
            continue
        if key not in ours and key == "vocabulary":
            ours[key] = vocabulary_fingerprint(vocab.columns, vocab.max_table_size, vocab.values)
        elif key not in ours:
            ours[key] = dataset_fingerprint(spec)
        if recorded[key] == ours[key]:
            continue
        held, hint = "another vocabulary: its categories would read as other ids", ""
        if key == "fingerprint":
            held = "other files (the checkpoint records their fingerprint, not its vocabulary's): its categories may read as other ids"
            hint = " (or this path as --data, to read its vocabulary all the same)"
        raise DlrmkitError(
            f"{folder}: the model was trained on {str(recorded.get('path'))[:200]}, but {where} holds {held}; "
            f"pass --data DIR, the dataset it was trained on{hint}"
        )


def model_ids(cfg: Any, ids: np.ndarray, dense: np.ndarray, stored_as: Any) -> np.ndarray:
    """The ids a model of `cfg` reads for these rows: ids rarer than its tables keep read as 0
    (--min-id-count), the values' buckets appended (--numerical-buckets, from the values as the
    dataset stores them)."""
    from dlrmkit.data.split_binary import bucket_columns

    buckets = [np.asarray(b, dtype=np.float32) for b in cfg.numerical_buckets or []]
    table_rows = np.asarray(cfg.table_sizes[: len(cfg.table_sizes) - len(buckets)], dtype=np.int64)
    ids = np.where(ids >= table_rows, 0, ids)
    if buckets:
        ids = np.concatenate([ids, bucket_columns(buckets, np.asarray(dense, dtype=stored_as))], axis=1)
    return ids


def csv_fields(values: Any) -> np.ndarray:
    """Text values (an Arrow string array) as CSV fields, as an object array: a value holding a
    comma, a double quote or a line break quoted, its quotes doubled (RFC 4180); others as they are."""
    import pyarrow as pa
    import pyarrow.compute as pc

    values = pa.array(values, pa.string()) if not isinstance(values, (pa.Array, pa.ChunkedArray)) else values
    quoted = pc.binary_join_element_wise('"', pc.replace_substring(values, '"', '""'), '"', "")
    needs = pc.match_substring_regex(values, '[",\r\n]')
    return pc.if_else(needs, quoted, values).to_numpy(zero_copy_only=False)


def write_csv(batches: Iterator[Scored], out: TextIO, keep: list[str] | None = None) -> None:
    """The scores as CSV, `keep` (the --keep-columns names) after the row number; the header comes
    with the first scored rows, so nothing at all is written when the input fails before any row is
    scored (the caller then reports the error)."""
    header_done, keep = False, list(keep or [])
    for b in batches:
        if not header_done:
            names = ["row", *csv_fields(keep), *(["label"] if b.labels is not None else []), "probability"]
            out.write(",".join(names) + "\n")
            header_done = True
        cols = [b.rows] + ([b.labels.astype(np.int64)] if b.labels is not None else [])
        if not b.kept:
            table = np.column_stack([*cols, b.probs.astype(np.float64)])
            np.savetxt(out, table, fmt=["%d"] * len(cols) + ["%.9g"], delimiter=",")
            continue
        table = np.empty((len(b.probs), len(cols) + len(b.kept) + 1), dtype=object)  # numbers, then text
        for j, col in enumerate([b.rows, *(csv_fields(k) for k in b.kept), *cols[1:], b.probs.astype(np.float64)]):
            table[:, j] = col
        fmt = ["%d", *["%s"] * len(b.kept), *["%d"] * (len(cols) - 1), "%.9g"]
        np.savetxt(out, table, fmt=fmt, delimiter=",")


def run(args: argparse.Namespace) -> int:
    from dlrmkit.atomic_io import atomic_write, check_not_inside, check_output_file, hold_output_lock, is_stdout
    from dlrmkit.untrusted import check_regular_input

    data = args.data
    if args.output and not data:
        try:
            data = dataset_dir(args.checkpoint, None)
        except DlrmkitError:
            data = None  # reported by the scoring itself
    check_not_inside(args.output, "--output", {"--checkpoint": args.checkpoint, "--data": data})
    check_output_file(args.output, "--output")
    check_regular_input(args.input, "--input")  # a FIFO or /dev/zero: one line, not a hang
    output = None if is_stdout(args.output) else args.output  # `-`, /dev/stdout: standard output itself
    if output and os.path.realpath(output) == os.path.realpath(args.input):
        raise DlrmkitError(f"--output {args.output}: is the --input file; choose another name")
    if output:
        hold_output_lock(output, "--output")  # one writer per output, before any work
    report = PredictReport()
    batches = score(args.checkpoint, args.input, args, report)
    if output:
        with atomic_write(output) as f:  # a failed run leaves no partial CSV (and the old one intact)
            write_csv(batches, f, kept_columns(args))
            if not report.rows_scored:
                raise report.no_valid_rows(args.input, args.no_label)
    else:
        write_csv(batches, sys.stdout, kept_columns(args))
        if not report.rows_scored:
            raise report.no_valid_rows(args.input, args.no_label)
    n_skipped = sum(report.skipped.values())
    msg = f"rows read {report.rows_read:,}  scored {report.rows_scored:,}  skipped {n_skipped:,}" + (
        " (" + ", ".join(f"{k} {v:,}" for k, v in report.skipped.items() if v) + ")" if n_skipped else ""
    )
    msg += f"  empty lines skipped {report.empty_lines:,}" if report.empty_lines else ""
    msg += f"  kept values not UTF-8 {report.escaped:,} (written with \\x escapes)" if report.escaped else ""
    from dlrmkit.commands.preprocess import long_values_note

    msg += f"  {long_values_note(report.long_values)}" if report.long_values else ""
    err = sys.stderr if not output else sys.stdout  # keep stdout pure CSV when it carries the scores
    print(msg, file=err)
    for pos in report.first_bad_rows:
        print(f"  bad row: {pos}", file=err)
    if output:
        print(f"wrote {report.rows_scored:,} probabilities to {output}", file=err)
    return 0
