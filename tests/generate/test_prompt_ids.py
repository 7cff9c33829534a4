"""Prompt ids stay distinct as text, and a row error caused by a manifest setting names that
setting: its key and the manifest's file and line, on one line."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from workbench.config import DatasetSpec, load_manifest
from workbench.errors import DataError
from workbench.generate.prompts import load_prompts
from workbench.profiles import get_profile

KIMI = get_profile("kimi-k2.5")


def write_jsonl(path: Path, rows: list[dict[str, Any]]) -> Path:
    path.write_text("".join(json.dumps(row) + "\n" for row in rows))
    return path


def load_error(spec: DatasetSpec) -> str:
    with pytest.raises(DataError) as caught:
        load_prompts(spec, KIMI)
    message = str(caught.value)
    assert "\n" not in message
    return message


# --- ids distinct as text --------------------------------------------------------------------


def text_spec(path: Path) -> DatasetSpec:
    return DatasetSpec(name="d", path=str(path), input="text")


def rows_of(*ids: Any) -> list[dict[str, Any]]:
    return [{"sample_id": sample_id, "text": "t"} for sample_id in ids]


@pytest.mark.parametrize(("first", "second"), [(1, "1"), ("1", 1), (-3, "-3")])
def test_ids_equal_as_text_are_refused_naming_both_lines(tmp_path: Path, first: Any,
                                                         second: Any) -> None:
    path = write_jsonl(tmp_path / "data.jsonl", rows_of(first, 2, second))
    assert load_error(text_spec(path)) == (
        f"{path}:3: sample_id {second!r} collides with sample_id {first!r} at line 1 "
        "(ids must stay distinct as text)")


def test_exact_duplicates_keep_their_message_and_distinct_texts_load(tmp_path: Path) -> None:
    path = write_jsonl(tmp_path / "data.jsonl", rows_of(1, 1))
    assert load_error(text_spec(path)) == f"{path}:2: duplicate sample_id 1 (first at line 1)"
    write_jsonl(path, rows_of(1, "01", "x"))
    assert [p.sample_id for p in load_prompts(text_spec(path), KIMI)] == [1, "01", "x"]


# --- row errors name the manifest setting behind them -----------------------------------------


def manifest(tmp_path: Path, data: str, id_field: str | None = "id") -> Path:
    """params/datasets.yaml whose datasets[1] reads `data` (its id_field on line 11)."""
    (tmp_path / "params").mkdir(exist_ok=True)
    (tmp_path / "other.jsonl").write_text("")
    path = tmp_path / "params" / "datasets.yaml"
    path.write_text(
        "model_profile: kimi-k2.5\n"
        "datasets:\n"
        "  - name: other\n"
        "    path: ../other.jsonl\n"
        "    input: text\n"
        "\n"
        "  # the code prompts\n"
        "  - name: code_instruct\n"
        f"    path: ../{data}\n"
        "    input: text\n"
        + (f"    id_field: {id_field}\n" if id_field else ""))
    return path


def spec_of(path: Path) -> DatasetSpec:
    return load_manifest(path).dataset("code_instruct")


def test_a_missing_id_field_names_the_key_and_its_line(tmp_path: Path) -> None:
    data = write_jsonl(tmp_path / "code_instruct.jsonl", [{"sample_id": 1, "text": "a"}])
    path = manifest(tmp_path, data.name)
    assert load_error(spec_of(path)) == (
        f"{data}:1: missing 'id' (datasets[1].id_field: id, {path}:11)")


def test_a_default_id_field_names_the_dataset_line(tmp_path: Path) -> None:
    data = write_jsonl(tmp_path / "code_instruct.jsonl", [{"id": 1, "text": "a"}])
    path = manifest(tmp_path, data.name, id_field=None)
    assert load_error(spec_of(path)) == (
        f"{data}:1: missing 'sample_id' (datasets[1].id_field defaults to sample_id, {path}:8)")


def test_a_missing_input_field_and_a_bad_id_type_name_their_keys(tmp_path: Path) -> None:
    rows = [{"id": 1, "text": "a"}, {"id": 2, "prompt": "b"}]
    data = write_jsonl(tmp_path / "code_instruct.jsonl", rows)
    path = manifest(tmp_path, data.name)
    assert load_error(spec_of(path)) == (
        f"{data}:2: missing 'text' (datasets[1].input: text, {path}:10)")
    write_jsonl(data, [{"id": 1.5, "text": "a"}])
    assert load_error(spec_of(path)) == (f"{data}:1: id must be an int or a string, got a float "
                                         f"(datasets[1].id_field: id, {path}:11)")


def test_a_missing_parquet_column_names_the_key(tmp_path: Path) -> None:
    data = tmp_path / "code_instruct.parquet"
    pq.write_table(pa.table({"sample_id": [1], "text": ["a"]}), data)
    path = manifest(tmp_path, data.name)
    assert load_error(spec_of(path)) == (f"{data}: missing column 'id' (columns: sample_id, text) "
                                         f"(datasets[1].id_field: id, {path}:11)")


def test_a_spec_built_in_code_names_no_manifest(tmp_path: Path) -> None:
    data = write_jsonl(tmp_path / "d.jsonl", [{"text": "a"}])
    assert load_error(text_spec(data)) == f"{data}:1: missing 'sample_id'"
