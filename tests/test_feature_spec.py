import copy
import os

import numpy as np
import pytest
import yaml

from dlrmkit.data.feature_spec import SPEC_FILE, FeatureSpec, categorical_dtype
from dlrmkit.errors import DatasetError, DlrmkitError


def write_doc(tmp_path, doc) -> str:
    path = tmp_path / SPEC_FILE
    path.write_text(yaml.safe_dump(doc, sort_keys=False))
    return str(path)


def default_doc(num_numerical=2, cards=(3, 300)):
    return copy.deepcopy(FeatureSpec.default(num_numerical, list(cards), metadata={"k": 1}).to_dict())


# ---- categorical_dtype ------------------------------------------------------------------------------


@pytest.mark.parametrize(
    "cardinality, dtype",
    [
        (1, np.int8),
        (126, np.int8),
        (127, np.int16),  # NVIDIA's rule: cardinality < iinfo.max, so 127 no longer fits int8
        (128, np.int16),
        (32766, np.int16),
        (32767, np.int32),
        (2**31 - 2, np.int32),
        (2**31 - 1, np.int64),
        (2**40, np.int64),
    ],
)
def test_categorical_dtype_follows_nvidia_rule(cardinality, dtype):
    assert categorical_dtype(cardinality) == np.dtype(dtype)


def test_categorical_dtype_too_large():
    with pytest.raises(DatasetError, match="int64"):
        categorical_dtype(2**63)


# ---- default layout and round trip ------------------------------------------------------------------


def test_default_layout():
    spec = FeatureSpec.default(3, [5, 200, 40000])
    assert spec.categorical_names == ["cat_0.bin", "cat_1.bin", "cat_2.bin"]
    assert spec.numerical_names == ["num_0", "num_1", "num_2"]
    assert spec.label_name == "label"
    assert spec.cardinalities == [5, 200, 40000]
    assert [spec.dtype(n) for n in spec.categorical_names] == [
        np.dtype(np.int8),
        np.dtype(np.int16),
        np.dtype(np.int32),
    ]
    assert spec.dtype("num_1") == np.dtype(np.float16)
    assert spec.dtype("label") == np.dtype(np.bool_)
    spec.check()  # the default layout satisfies its own schema
    files = spec.mapping_files("test")
    assert files.label == [os.path.join(".", "test/label.bin")]
    assert files.numerical == [os.path.join(".", "test/numerical.bin")]
    assert files.categorical == [[os.path.join(".", f"test/cat_{i}.bin")] for i in range(3)]


@pytest.mark.parametrize("num_numerical, cards", [(4, [3, 8, 20]), (0, [2]), (13, [10, 100_000, 7])])
def test_default_round_trips_through_yaml(tmp_path, num_numerical, cards):
    spec = FeatureSpec.default(num_numerical, cards, metadata={"seed": 3, "rows": {"train": 10, "test": 2}})
    path = spec.write(str(tmp_path))
    assert path == str(tmp_path / SPEC_FILE)
    for source in (str(tmp_path), path):  # the folder or the file itself
        back = FeatureSpec.from_yaml(source)
        assert back.feature_spec == spec.feature_spec
        assert back.source_spec == spec.source_spec
        assert back.channel_spec == spec.channel_spec
        assert back.metadata == spec.metadata
        assert back.base_directory == str(tmp_path.resolve())
        assert back.cardinalities == cards
    files = back.mapping_files("train")
    assert files.label == [str(tmp_path.resolve() / "train" / "label.bin")]


# ---- errors name the field --------------------------------------------------------------------------


def test_missing_file(tmp_path):
    with pytest.raises(DatasetError, match="no such FeatureSpec file") as info:
        FeatureSpec.from_yaml(str(tmp_path / "nope.yaml"))
    assert "nope.yaml" in str(info.value)


def test_invalid_yaml(tmp_path):
    path = tmp_path / SPEC_FILE
    path.write_text("feature_spec: [unclosed\n")
    with pytest.raises(DatasetError, match="not valid YAML") as info:
        FeatureSpec.from_yaml(str(path))
    assert SPEC_FILE in str(info.value)


def test_not_a_mapping(tmp_path):
    path = write_doc(tmp_path, ["a", "b"])
    with pytest.raises(DatasetError, match="expected a mapping"):
        FeatureSpec.from_yaml(path)


@pytest.mark.parametrize("section", ["feature_spec", "source_spec", "channel_spec"])
def test_missing_section_is_named(tmp_path, section):
    doc = default_doc()
    del doc[section]
    path = write_doc(tmp_path, doc)
    with pytest.raises(DatasetError) as info:
        FeatureSpec.from_yaml(path)
    msg = str(info.value)
    assert "missing section" in msg and section in msg
    assert path in msg
    assert isinstance(info.value, DlrmkitError)


def test_missing_channel_is_named(tmp_path):
    doc = default_doc()
    del doc["channel_spec"]["numerical"]
    with pytest.raises(DatasetError, match="channel_spec has no 'numerical' channel"):
        FeatureSpec.from_yaml(write_doc(tmp_path, doc))


def test_feature_in_channel_spec_missing_from_feature_spec(tmp_path):
    doc = default_doc()
    del doc["feature_spec"]["cat_1.bin"]
    with pytest.raises(DatasetError) as info:
        FeatureSpec.from_yaml(write_doc(tmp_path, doc))
    msg = str(info.value)
    assert "'cat_1.bin'" in msg and "not in feature_spec" in msg


@pytest.mark.parametrize("bad", ["float99", "notatype", 5])
def test_bad_dtype_is_named(tmp_path, bad):
    doc = default_doc()
    doc["feature_spec"]["num_1"]["dtype"] = bad
    with pytest.raises(DatasetError) as info:
        FeatureSpec.from_yaml(write_doc(tmp_path, doc))
    msg = str(info.value)
    assert "feature_spec.num_1.dtype" in msg and str(bad) in msg


def test_missing_dtype_is_named(tmp_path):
    doc = default_doc()
    del doc["feature_spec"]["label"]["dtype"]
    with pytest.raises(DatasetError, match=r"feature_spec\.label has no dtype"):
        FeatureSpec.from_yaml(write_doc(tmp_path, doc))


def test_categorical_dtype_must_be_integer(tmp_path):
    doc = default_doc()
    doc["feature_spec"]["cat_0.bin"]["dtype"] = "float32"
    with pytest.raises(
        DatasetError, match=r"feature_spec\.cat_0\.bin\.dtype 'float32' is not allowed for a categorical"
    ):
        FeatureSpec.from_yaml(write_doc(tmp_path, doc))


def test_cardinality_too_big_for_dtype_is_named(tmp_path):
    doc = default_doc()
    doc["feature_spec"]["cat_1.bin"]["dtype"] = "int8"  # cardinality 300
    with pytest.raises(DatasetError) as info:
        FeatureSpec.from_yaml(write_doc(tmp_path, doc))
    msg = str(info.value)
    assert "cat_1.bin" in msg and "300" in msg and "int8" in msg


@pytest.mark.parametrize("card", [None, 0, -4, "ten"])
def test_bad_cardinality_is_named(tmp_path, card):
    doc = default_doc()
    if card is None:
        del doc["feature_spec"]["cat_0.bin"]["cardinality"]
    else:
        doc["feature_spec"]["cat_0.bin"]["cardinality"] = card
    with pytest.raises(DatasetError, match=r"feature_spec\.cat_0\.bin\.cardinality must be a positive integer"):
        FeatureSpec.from_yaml(write_doc(tmp_path, doc))


@pytest.mark.parametrize("mapping", ["train", "test"])
def test_missing_mapping_is_named(tmp_path, mapping):
    doc = default_doc()
    del doc["source_spec"][mapping]
    with pytest.raises(DatasetError) as info:
        FeatureSpec.from_yaml(write_doc(tmp_path, doc))
    msg = str(info.value)
    assert f"source_spec has no '{mapping}' mapping" in msg


def test_mapping_files_of_unknown_mapping_is_named(tmp_path):
    spec = FeatureSpec.default(1, [3], base_directory=str(tmp_path))
    with pytest.raises(DatasetError, match="no mapping 'valid'"):
        spec.mapping_files("valid")


def test_feature_without_file_is_named(tmp_path):
    doc = default_doc()
    doc["source_spec"]["test"] = [c for c in doc["source_spec"]["test"] if c["features"] != ["cat_1.bin"]]
    with pytest.raises(DatasetError) as info:
        FeatureSpec.from_yaml(write_doc(tmp_path, doc))
    msg = str(info.value)
    assert "mapping 'test'" in msg and "cat_1.bin" in msg


def test_source_feature_not_in_channel_spec_is_named(tmp_path):
    doc = default_doc()
    doc["source_spec"]["train"].append({"type": "split_binary", "features": ["ghost"], "files": ["train/ghost.bin"]})
    with pytest.raises(DatasetError) as info:
        FeatureSpec.from_yaml(write_doc(tmp_path, doc))
    msg = str(info.value)
    assert "source_spec.train[" in msg and "'ghost'" in msg


def test_unsupported_source_type_is_named(tmp_path):
    doc = default_doc()
    doc["source_spec"]["train"][1]["type"] = "csv"
    with pytest.raises(DatasetError) as info:
        FeatureSpec.from_yaml(write_doc(tmp_path, doc))
    msg = str(info.value)
    assert "source_spec.train[1].type" in msg and "csv" in msg


def test_duplicate_feature_in_mapping_is_named(tmp_path):
    doc = default_doc()
    doc["source_spec"]["train"].append(copy.deepcopy(doc["source_spec"]["train"][-1]))
    with pytest.raises(DatasetError, match="appears twice in mapping 'train'"):
        FeatureSpec.from_yaml(write_doc(tmp_path, doc))


def test_label_channel_must_have_one_feature(tmp_path):
    doc = default_doc()
    doc["channel_spec"]["label"] = ["label", "num_0"]
    with pytest.raises(DatasetError, match="channel_spec.label must name exactly one feature"):
        FeatureSpec.from_yaml(write_doc(tmp_path, doc))
