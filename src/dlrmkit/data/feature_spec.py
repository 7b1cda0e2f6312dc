"""FeatureSpec: the YAML that describes a dataset of split binary files.

The schema is NVIDIA DeepLearningExamples' DLRM FeatureSpec (feature_spec / source_spec /
channel_spec / metadata), so datasets move between the two systems unchanged. Parsing checks
the document's structure and reports the exact field that is wrong; the files themselves are
checked against it by `split_binary.SplitBinaryDataset`.
"""

from __future__ import annotations

import os
from dataclasses import dataclass, field
from typing import Any

import numpy as np
import yaml

from dlrmkit.errors import DatasetError, DlrmkitError
from dlrmkit.model.config import MAX_HOTNESS
from dlrmkit.untrusted import load_yaml

SPEC_FILE = "feature_spec.yaml"
CATEGORICAL, NUMERICAL, LABEL = "categorical", "numerical", "label"
TRAIN, TEST = "train", "test"
VAL = "val"  # optional validation mapping (model selection reads it; NVIDIA's readers ignore it)
SPLIT_BINARY = "split_binary"
MAX_SPEC_BYTES = 8 << 20  # a Criteo spec is ~10 KB; each byte is parsed in Python
# dtypes each channel may use (NVIDIA's DLRM: bool labels, float16 numericals, integer ids), in
# the machine's byte order. Anything else (object, strings, structured, big-endian) is refused:
# read as `object`, file bytes would be taken for Python pointers.
ALLOWED_DTYPES = {
    LABEL: ("bool", "uint8", "int8"),
    NUMERICAL: ("float16", "float32"),
    CATEGORICAL: ("int8", "int16", "int32", "int64", "uint8", "uint16", "uint32"),
}


def file_key(path: str) -> tuple[int, int] | str:
    """What makes two names one file: its device and inode (so a symbolic or hard link, or
    another spelling, is the same file), or the real path of a file that does not exist."""
    try:
        st = os.stat(path)
        return (st.st_dev, st.st_ino)
    except (OSError, ValueError):
        return os.path.realpath(path)


def categorical_dtype(cardinality: int) -> np.dtype:
    """Smallest signed integer type that holds ids 0..cardinality-1 (NVIDIA's rule: size < max)."""
    for dtype in (np.int8, np.int16, np.int32):
        if cardinality < np.iinfo(dtype).max:
            return np.dtype(dtype)
    if cardinality < np.iinfo(np.int64).max:
        return np.dtype(np.int64)
    raise DatasetError(f"cardinality {cardinality} does not fit in int64")


@dataclass
class MappingFiles:
    """Absolute paths of one mapping's files; a feature may be split over several chunk files."""

    label: list[str]
    numerical: list[str]
    categorical: list[list[str]]  # in channel order


@dataclass
class FeatureSpec:
    feature_spec: dict[str, dict[str, Any]]
    source_spec: dict[str, list[dict[str, Any]]]
    channel_spec: dict[str, list[str]]
    metadata: dict[str, Any] = field(default_factory=dict)
    base_directory: str = "."

    # ---- construction -------------------------------------------------------------------
    @classmethod
    def default(
        cls,
        num_numerical: int,
        cardinalities: list[int],
        metadata: dict[str, Any] | None = None,
        base_directory: str = ".",
        val: bool = False,
        hotness: list[int] | None = None,
        numerical_dtype: str = "float16",
    ) -> "FeatureSpec":
        """The standard layout: <mapping>/numerical.bin, label.bin, cat_<i>.bin; `val` adds a
        validation mapping between train and test. `hotness`: ids per sample of each categorical
        feature (a fixed-size bag; recorded only where it is not 1, so one-hot specs stay as they were)."""
        num_names = [f"num_{i}" for i in range(num_numerical)]
        cat_names = [f"cat_{i}.bin" for i in range(len(cardinalities))]
        features: dict[str, dict[str, Any]] = {}
        for i, (name, card) in enumerate(zip(cat_names, cardinalities)):
            features[name] = {"dtype": str(categorical_dtype(int(card))), "cardinality": int(card)}
            if hotness is not None and hotness[i] != 1:
                features[name]["hotness"] = int(hotness[i])
        for name in num_names:
            features[name] = {"dtype": numerical_dtype}
        features["label"] = {"dtype": "bool"}
        source: dict[str, list[dict[str, Any]]] = {}
        for mapping in (TRAIN, VAL, TEST) if val else (TRAIN, TEST):
            chunks: list[dict[str, Any]] = []
            if num_names:
                chunks.append({"type": SPLIT_BINARY, "features": num_names, "files": [f"{mapping}/numerical.bin"]})
            chunks.append({"type": SPLIT_BINARY, "features": ["label"], "files": [f"{mapping}/label.bin"]})
            for name in cat_names:
                chunks.append({"type": SPLIT_BINARY, "features": [name], "files": [f"{mapping}/{name}"]})
            source[mapping] = chunks
        channels = {CATEGORICAL: cat_names, NUMERICAL: num_names, LABEL: ["label"]}
        return cls(features, source, channels, dict(metadata or {}), base_directory)

    @classmethod
    def from_yaml(cls, path: str) -> "FeatureSpec":
        """Read a spec file, or the feature_spec.yaml inside a dataset folder."""
        if os.path.isdir(path):
            path = os.path.join(path, SPEC_FILE)
        if not os.path.exists(path):
            raise DatasetError(f"{path}: no such FeatureSpec file")
        # bounded (size, alias expansion, nesting), regular files only (a FIFO would block), no key twice
        try:
            doc = load_yaml(path, "FeatureSpec", MAX_SPEC_BYTES)
        except DlrmkitError as exc:
            raise DatasetError(str(exc)) from None  # a dataset's fault, as every other spec error
        if not isinstance(doc, dict):
            raise DatasetError(f"{path}: expected a mapping with feature_spec, source_spec, channel_spec")
        missing = [k for k in ("feature_spec", "source_spec", "channel_spec") if k not in doc]
        if missing:
            raise DatasetError(f"{path}: missing section(s) {', '.join(missing)}")
        spec = cls(
            feature_spec=doc["feature_spec"] or {},
            source_spec=doc["source_spec"] or {},
            channel_spec=doc["channel_spec"] or {},
            metadata=doc.get("metadata") or {},
            base_directory=os.path.dirname(os.path.abspath(path)),
        )
        spec.check(where=path)
        return spec

    def to_dict(self) -> dict[str, Any]:
        return {
            "feature_spec": self.feature_spec,
            "source_spec": self.source_spec,
            "channel_spec": self.channel_spec,
            "metadata": self.metadata,
        }

    def write(self, directory: str | None = None) -> str:
        path = os.path.join(directory or self.base_directory, SPEC_FILE)
        with open(path, "w", encoding="utf-8") as f:
            yaml.safe_dump(self.to_dict(), f, sort_keys=False)
        return path

    # ---- accessors ----------------------------------------------------------------------
    @property
    def categorical_names(self) -> list[str]:
        return list(self.channel_spec.get(CATEGORICAL, []))

    @property
    def numerical_names(self) -> list[str]:
        return list(self.channel_spec.get(NUMERICAL, []))

    @property
    def label_name(self) -> str:
        return self.channel_spec[LABEL][0]

    def check_paths(self, where: str) -> None:
        """Every file named by source_spec stays inside the dataset folder: relative, no `..`
        that leaves it, no symbolic link that points outside it. A file holds the rows of one
        feature of one mapping: named twice (one feature read twice, two features sharing a
        file, the test rows being training rows) it is refused, as silent duplicates would be."""
        base = os.path.realpath(self.base_directory)
        owner: dict[tuple[int, int] | str, str] = {}  # file -> "mapping feature" that names it
        for mapping, chunks in self.source_spec.items():
            for i, chunk in enumerate(chunks):
                for name in chunk["files"]:
                    at = f"{where}: source_spec.{mapping}[{i}].files: {name!r}"
                    if not name.isprintable():
                        raise DatasetError(f"{at} holds a control character (NUL, newline, ...)")
                    if os.path.isabs(name) or name.startswith("~"):
                        raise DatasetError(f"{at} is an absolute path; files must be inside the dataset folder")
                    real = os.path.realpath(os.path.join(base, name))
                    if real != base and not real.startswith(base.rstrip(os.sep) + os.sep):
                        raise DatasetError(f"{at} points outside the dataset folder")
                    if os.path.exists(real) and not os.path.isfile(real):
                        raise DatasetError(f"{at} is not a regular file")
                    key = file_key(real)
                    if key in owner:
                        raise DatasetError(
                            f"{at} is also the file of {owner[key]}; each file holds one feature of one mapping"
                        )
                    owner[key] = f"mapping '{mapping}' feature '{chunk['features'][0]}'"

    @property
    def cardinalities(self) -> list[int]:
        return [int(self.feature_spec[n]["cardinality"]) for n in self.categorical_names]

    @property
    def hotness(self) -> list[int]:
        """Ids per sample of each categorical feature: a multi-hot feature's file holds `hotness`
        ids per row (a fixed-size bag, row-major); 1 for one-hot features."""
        return [int(self.feature_spec[n].get("hotness", 1)) for n in self.categorical_names]

    @property
    def has_val(self) -> bool:
        return VAL in self.source_spec

    def dtype(self, feature: str) -> np.dtype:
        return np.dtype(self.feature_spec[feature]["dtype"])

    @property
    def numerical_dtype(self) -> np.dtype:
        """The one dtype of the numerical features (checked: they share one); float16 when there are none."""
        return self.dtype(self.numerical_names[0]) if self.numerical_names else np.dtype(np.float16)

    def mapping_files(self, mapping: str) -> MappingFiles:
        if mapping not in self.source_spec:
            raise DatasetError(
                f"{self.base_directory}/{SPEC_FILE}: no mapping '{mapping}' (have: {', '.join(self.source_spec)})"
            )
        cat_index = {n: i for i, n in enumerate(self.categorical_names)}
        label: list[str] = []
        numerical: list[str] = []
        categorical: list[list[str]] = [[] for _ in cat_index]
        for chunk in self.source_spec[mapping]:
            files = [os.path.join(self.base_directory, f) for f in chunk["files"]]
            first = chunk["features"][0]
            if first == self.label_name:
                label = files
            elif first in cat_index:
                categorical[cat_index[first]] = files
            else:
                numerical = files
        return MappingFiles(label, numerical, categorical)

    # ---- validation of the document itself ---------------------------------------------------
    def check(self, where: str = SPEC_FILE) -> None:
        """Raise DatasetError naming the first field that breaks the schema."""

        def fail(msg: str) -> None:
            raise DatasetError(f"{where}: {msg}")

        for section, value in (
            ("feature_spec", self.feature_spec),
            ("source_spec", self.source_spec),
            ("channel_spec", self.channel_spec),
            ("metadata", self.metadata),
        ):
            if not isinstance(value, dict):
                fail(f"{section} must be a mapping, got {type(value).__name__}")
        for channel in (CATEGORICAL, NUMERICAL, LABEL):
            if channel not in self.channel_spec:
                fail(f"channel_spec has no '{channel}' channel")
            names = self.channel_spec[channel]
            if names is None and channel != LABEL:
                self.channel_spec[channel] = names = []
            if not isinstance(names, list) or not all(isinstance(n, str) and n for n in names):
                fail(f"channel_spec.{channel} must be a list of feature names")
        if len(self.channel_spec[LABEL]) != 1:
            fail(f"channel_spec.label must name exactly one feature, got {self.channel_spec[LABEL]}")
        channel_features = self.categorical_names + self.numerical_names + [self.label_name]
        if len(set(channel_features)) != len(channel_features):
            fail("channel_spec names a feature more than once")
        if not self.categorical_names and not self.numerical_names:
            fail("channel_spec has no categorical and no numerical feature: a model needs at least one")
        for name in channel_features:
            if name not in self.feature_spec:
                fail(f"feature '{name}' is in channel_spec but not in feature_spec")
            entry = self.feature_spec[name]
            if not isinstance(entry, dict) or "dtype" not in entry:
                fail(f"feature_spec.{name} has no dtype")
            channel = (
                CATEGORICAL if name in self.categorical_names else NUMERICAL if name in self.numerical_names else LABEL
            )
            try:
                dtype = np.dtype(entry["dtype"]) if isinstance(entry["dtype"], str) else None
            except (TypeError, ValueError, SyntaxError):
                dtype = None
            allowed = ALLOWED_DTYPES[channel]
            if dtype is None or not any(dtype == np.dtype(a) for a in allowed):
                fail(
                    f"feature_spec.{name}.dtype {entry['dtype']!r} is not allowed for a {channel} feature "
                    f"(use one of {', '.join(allowed)})"
                )
        for name in self.categorical_names:
            card = self.feature_spec[name].get("cardinality")
            if not isinstance(card, int) or isinstance(card, bool) or card <= 0:
                fail(f"feature_spec.{name}.cardinality must be a positive integer, got {card!r}")
            if not np.issubdtype(self.dtype(name), np.integer):
                fail(f"feature_spec.{name}.dtype must be an integer type, got {self.dtype(name)}")
            if card - 1 > np.iinfo(self.dtype(name)).max:
                fail(f"feature_spec.{name}: cardinality {card} does not fit dtype {self.dtype(name)}")
            hot = self.feature_spec[name].get("hotness", 1)
            if not isinstance(hot, int) or isinstance(hot, bool) or not 1 <= hot <= MAX_HOTNESS:
                fail(f"feature_spec.{name}.hotness must be an integer in [1, {MAX_HOTNESS}], got {hot!r}")
        for name in self.numerical_names:
            if self.dtype(name) != self.dtype(self.numerical_names[0]):
                fail(f"feature_spec.{name}: all numerical features must share one dtype")
        for mapping, chunks in self.source_spec.items():
            if not isinstance(chunks, list) or not all(isinstance(c, dict) for c in chunks):
                fail(f"source_spec.{mapping} must be a list of chunks (type, features, files)")
            for i, chunk in enumerate(chunks):
                for key in ("features", "files"):
                    v = chunk.get(key)
                    if not isinstance(v, list) or not v or not all(isinstance(x, str) and x for x in v):
                        fail(f"source_spec.{mapping}[{i}].{key} must be a non-empty list of names")
        for mapping in (TRAIN, TEST, VAL):
            if mapping not in self.source_spec:
                if mapping == VAL:
                    continue
                fail(f"source_spec has no '{mapping}' mapping")
            seen: set[str] = set()
            for i, chunk in enumerate(self.source_spec[mapping]):
                at = f"source_spec.{mapping}[{i}]"
                if chunk.get("type") != SPLIT_BINARY:
                    fail(f"{at}.type is {chunk.get('type')!r}; only '{SPLIT_BINARY}' is supported")
                feats, files = chunk.get("features") or [], chunk.get("files") or []
                if not feats or not files:
                    fail(f"{at} needs non-empty 'features' and 'files'")
                for feat in feats:
                    if feat in seen:
                        fail(f"{at}: feature '{feat}' appears twice in mapping '{mapping}'")
                    if feat not in channel_features:
                        fail(f"{at}: feature '{feat}' is not in channel_spec")
                    seen.add(feat)
                if feats[0] in self.numerical_names and feats != self.numerical_names:
                    fail(f"{at}: numerical features must be one chunk in channel_spec order")
                if feats[0] not in self.numerical_names and len(feats) != 1:
                    fail(f"{at}: categorical and label features take one file chunk each")
            absent = [f for f in channel_features if f not in seen]
            if absent:
                fail(f"mapping '{mapping}' has no file for feature(s) {', '.join(absent)}")
        self.check_paths(where)
        self.check_metadata(fail)

    def check_metadata(self, fail) -> None:
        """The metadata fields dlrmkit reads (others are free-form, as in NVIDIA's specs)."""
        auc = self.metadata.get("optimal_auc")
        if auc is not None and (
            not isinstance(auc, (int, float)) or isinstance(auc, bool) or not (0 <= auc <= 1 or auc != auc)
        ):  # NaN: undefined (a one-class test mapping)
            fail(f"metadata.optimal_auc must be a number in [0, 1], got {auc!r}")
        rows = self.metadata.get("rows")
        if rows is not None and (
            not isinstance(rows, dict)
            or not all(isinstance(v, int) and not isinstance(v, bool) and v >= 0 for v in rows.values())
        ):
            fail(f"metadata.rows must map each mapping to its row count, got {rows!r}")
