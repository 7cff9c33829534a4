"""A dataset that wrote nothing is an error validate --strict fails on, never a quiet pass."""

from __future__ import annotations

import json
from pathlib import Path

from conftest import workbench


def test_a_dataset_whose_prompts_all_failed_fails_validate_strict(tmp_path: Path) -> None:
    out = tmp_path / "out"
    (out / "d").mkdir(parents=True)
    (out / "run.json").write_text(json.dumps({"model_profile": "kimi-k2.5", "datasets": {"d": {}}}))
    (out / "d" / "prompts.jsonl").write_text("".join(
        json.dumps({"sample_id": i, "input_ids": [1, 2, 3]}) + "\n" for i in range(30)))
    (out / "d" / "raw_responses.jsonl").write_text("")
    (out / "d" / "errors.jsonl").write_text("".join(json.dumps(
        {"sample_id": i, "attempt": 1, "error_type": "aborted", "http_status": None,
         "message": "aborted", "ts": 1.0}) + "\n" for i in range(30)))
    checked = workbench("validate", str(out), "--strict")
    assert checked.returncode == 1, checked.stdout
    assert "no_records" in checked.stdout and "none of its 30 prepared prompts" in checked.stdout
    assert json.loads(workbench("validate", str(out), "--json").stdout)["datasets"]["d"]["ok"] is False
