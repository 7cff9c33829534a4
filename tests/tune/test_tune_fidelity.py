"""The fidelity probe in a sweep of the simulator: fp8 KV and a corrupted hierarchical cache
drift from the baseline's replies and are excluded from the recommendation, a bf16
configuration stays within the noise floor; the figures are in results.csv."""

from __future__ import annotations

import csv
import json
from collections.abc import Iterator
from pathlib import Path

import pytest
import yaml

from workbench.tune import SweepSummary, recommend_sweep, run_sweep
from workbench.tune.probe import PROBE_AGAIN_FILE, PROBE_FILE

pytestmark = pytest.mark.integration


@pytest.fixture(scope="module")
def probed(tmp_path_factory: pytest.TempPathFactory) -> Iterator[tuple[Path, SweepSummary, list[str]]]:
    folder = tmp_path_factory.mktemp("fidelity")
    params = {
        "server": {"launcher": "sim", "startup_timeout": 30, "stop_grace": 5,
                   "sim": {"profile": "dense-8b-1x24gb", "speed": 20}},
        "grid": {"baseline": "bf16", "configs": [
            {"name": "bf16", "args": {"mem_fraction_static": 0.80, "kv_cache_dtype": "bf16"}},
            {"name": "cps512", "args": {"mem_fraction_static": 0.80, "kv_cache_dtype": "bf16",
                                        "chunked_prefill_size": 512}},
            {"name": "fp8", "args": {"mem_fraction_static": 0.88, "kv_cache_dtype": "fp8_e4m3"}},
            {"name": "hicache-bad", "args": {
                "mem_fraction_static": 0.80, "kv_cache_dtype": "bf16",
                "enable_hierarchical_cache": True, "hicache_size": 8,
                "fault_hicache_corrupt_rate": 1.0}},
        ]},
        "load": {"concurrency": [48], "warmup_requests": 8, "duration": 8, "max_new_tokens": 256,
                 "prompts": {"count": 60, "input_len": [1500, 2500], "shared_prefix": 128,
                             "prefix_groups": 4},
                 "sample_interval": 0.5},
        "projection": {"remaining_tokens": 10_000_000},
        "fidelity": {"prompts": 24, "max_new_tokens": 512, "concurrency": 8},
    }
    path = folder / "tuning.yaml"
    path.write_text(yaml.safe_dump(params))
    said: list[str] = []
    out = folder / "out"
    summary = run_sweep(path, out, say=said.append)
    yield out, summary, said


def test_the_probe_files_and_the_figures(probed: tuple[Path, SweepSummary, list[str]]) -> None:
    out, summary, said = probed
    assert summary.failed == 0
    for config in ("bf16", "cps512", "fp8", "hicache-bad"):
        lines = [json.loads(x) for x in (out / config / PROBE_FILE).read_text().splitlines()]
        assert len(lines) == 24 and all("error" not in x for x in lines)
        assert all(len(x["output_ids"]) == len(x["logprobs"]) > 0 for x in lines)
    assert (out / "bf16" / PROBE_AGAIN_FILE).is_file()
    assert not (out / "fp8" / PROBE_AGAIN_FILE).exists()
    assert any(m.startswith("bf16: fidelity probe of 24 prompts in ") for m in said)
    with (out / "results.csv").open() as f:
        rows = {r["config"]: r for r in csv.DictReader(f)}
    assert {float(r["floor_identical_share"]) for r in rows.values()} == {
        float(rows["bf16"]["identical_share"])}  # the baseline against itself is the floor
    assert float(rows["cps512"]["identical_share"]) >= float(rows["bf16"]["identical_share"]) - 0.05
    assert float(rows["fp8"]["identical_share"]) < 0.85
    assert float(rows["fp8"]["logprob_diff"]) > 0 and float(rows["fp8"]["first_divergence"]) > 0
    assert float(rows["hicache-bad"]["identical_share"]) < 0.85


def test_drifting_configurations_are_excluded(probed: tuple[Path, SweepSummary, list[str]]) -> None:
    out, _, _ = probed
    rec = recommend_sweep(out)
    excluded = {r.config for r in rec.rows if r.excluded is not None}
    assert excluded == {"fp8", "hicache-bad"}
    assert rec.best in ("bf16", "cps512")
    fp8 = rec.row("fp8")
    assert fp8 is not None and fp8.excluded is not None
    assert fp8.excluded.startswith("fp8: ") and "of replies differ from bf16 before token 512 " \
        "(noise floor " in fp8.excluded and fp8.excluded.endswith("): excluded")
    assert rec.to_dict()["exclusions"] == rec.exclusions


def test_the_report_has_the_fidelity_section(probed: tuple[Path, SweepSummary, list[str]],
                                             tmp_path: Path) -> None:
    from workbench.report.render import cell_data
    from workbench.tune import tuning_report

    out, _, _ = probed
    report = tuning_report(out, tmp_path / "reports")
    shown = {row["config"]: row for row in cell_data(report.notebook_path, "fidelity")}
    assert set(shown) == {"bf16", "cps512", "fp8", "hicache-bad"} and shown["bf16"]["baseline"]
    assert shown["fp8"]["excluded"].endswith("): excluded") and shown["cps512"]["excluded"] is None
    html = report.html_path.read_text()
    assert "Output throughput against fidelity to the baseline" in html
