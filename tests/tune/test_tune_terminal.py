"""`workbench tune` in the terminal: it ends with the recommendation and the job's projection."""

from __future__ import annotations

import re
from pathlib import Path

import pytest
from conftest import workbench
from test_tune import sim_params, write_params


@pytest.mark.integration
def test_tune_ends_with_its_recommendation_and_projection(tmp_path: Path) -> None:
    params = write_params(tmp_path, sim_params([{"name": "only", "args": {"mem_fraction_static": 0.85}}],
                                               concurrency=[4], duration=3, warmup_requests=2,
                                               prompts={"count": 40, "input_len": [100, 200]}))
    done = workbench("tune", "--params", str(params), "--out", str(tmp_path / "out"))
    assert done.returncode == 0, done.stdout[-2000:] + done.stderr[-2000:]
    last = done.stdout.strip().splitlines()[-2:]
    assert re.match(r"recommended: only at concurrency 4: [\d,]+ output tok/s; job of 10,000,000 "
                    r"completion tokens.*: .*\d", last[0]), last
    assert last[1] == f"results: {tmp_path / 'out' / 'results.csv'}"
