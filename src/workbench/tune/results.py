"""A sweep's output directory: point folders, results.csv, sweep.json, and the frames the
report draws.
"""

from __future__ import annotations

import csv
import io
import json
import os
import time
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

import msgspec

from workbench import __version__
from workbench.errors import InputError
from workbench.rundir.files import write_atomic
from workbench.server.launch import command_line
from workbench.server.spec import redact, redact_argv
from workbench.tune.measurement import RESULT_COLUMNS, PointResult
from workbench.tune.parameters import (
    Command,
    ConfigPlan,
    LoadParams,
    TuningParams,
)

__all__ = [
    "PointPlan",
    "configs_frame",
    "curves_frame",
    "load_results",
    "results_frame",
    "sweep_overview",
    "sweep_params",
]

if TYPE_CHECKING:
    import pandas as pd

SWEEP_FILE = "sweep.json"
RESULTS_FILE = "results.csv"
RESULT_FILE = "result.json"


@dataclass(frozen=True, slots=True)
class PointPlan:
    """One point of the sweep and its folder."""

    config: str
    concurrency: int | str
    repeat: int
    folder: Path

    @property
    def result_path(self) -> Path:
        return self.folder / RESULT_FILE


def plan_points(out: Path, configs: Sequence[ConfigPlan], load: LoadParams,
                repeats: int) -> dict[str, list[PointPlan]]:
    """Every configuration's points, concurrency ascending, repeats innermost."""
    points: dict[str, list[PointPlan]] = {}
    for config in configs:
        points[config.name] = [
            PointPlan(config.name, c, r, out / config.name / _point_folder(c, r, repeats))
            for c in sorted(load.concurrency, key=_concurrency_order) for r in range(1, repeats + 1)
        ]
    return points


def _concurrency_order(concurrency: int | str) -> tuple[bool, int]:
    """Fixed concurrencies ascending, then auto."""
    return (not isinstance(concurrency, int), concurrency if isinstance(concurrency, int) else 0)


def _point_folder(concurrency: int | str, repeat: int, repeats: int) -> str:
    return f"c{concurrency}" if repeats == 1 else f"c{concurrency}-r{repeat}"




def _write_json(path: Path, value: Any) -> None:
    write_atomic(path, msgspec.json.format(msgspec.json.encode(value), indent=2) + b"\n")


def read_point(plan: PointPlan) -> PointResult | None:
    """The point's result, or None when it has not finished."""
    try:
        return msgspec.json.decode(plan.result_path.read_bytes(), type=PointResult)
    except (OSError, msgspec.DecodeError, msgspec.ValidationError):
        return None


def write_results_csv(out: Path, results: Sequence[PointResult]) -> Path:
    """results.csv from the given points (written whole, then renamed into place)."""
    buffer = io.StringIO()
    writer = csv.writer(buffer, lineterminator="\n")
    writer.writerow(RESULT_COLUMNS)
    for result in results:
        writer.writerow([_cell(getattr(result, name)) for name in RESULT_COLUMNS])
    path = out / RESULTS_FILE
    write_atomic(path, buffer.getvalue().encode())
    return path


def _cell(value: Any) -> str:
    if value is None:
        return ""
    if isinstance(value, dict):
        return json.dumps(value, sort_keys=True)
    if isinstance(value, bool):
        return "true" if value else "false"
    return str(value)


def _sweep_record(params: TuningParams, commands: Sequence[Command],
                  points: Mapping[str, list[PointPlan]]) -> dict[str, Any]:
    return {
        "workbench_version": __version__,
        "created": time.time(),
        "params": redact(msgspec.to_builtins(params)),
        "configs": [{"name": c.config, "command": command_line(redact_argv(c.argv)),
                     "env": sorted(c.env), "ignored": c.ignored} for c in commands],
        "points": [str(p.folder.relative_to(p.folder.parent.parent))
                   for plans in points.values() for p in plans],
    }


def load_results(out: str | os.PathLike[str]) -> list[PointResult]:
    """The finished points of a sweep directory, in the sweep's order (failed ones included);
    InputError when there is no such directory."""
    root = Path(out)
    if not root.is_dir():
        raise InputError(f"{root}: no such sweep directory")
    record = _read_sweep_record(root)
    if record is not None:
        folders = [root / rel for rel in record.get("points", [])]
    else:
        folders = sorted(path.parent for path in root.glob(f"*/*/{RESULT_FILE}"))
    results = []
    for folder in folders:
        result = read_point(PointPlan("", 0, 0, folder))
        if result is not None:
            results.append(result)
    return results


def _read_sweep_record(root: Path) -> dict[str, Any] | None:
    try:
        data = json.loads((root / SWEEP_FILE).read_text())
    except (OSError, ValueError):
        return None
    return data if isinstance(data, dict) else None


def sweep_params(out: str | os.PathLike[str]) -> TuningParams:
    """The parameters a sweep directory was run with (from its sweep.json)."""
    record = _read_sweep_record(Path(out))
    if record is None:
        raise InputError(f"{out}: no {SWEEP_FILE} (not a sweep directory)")
    return msgspec.convert(record["params"], TuningParams)


def results_frame(results: Sequence[PointResult]) -> pd.DataFrame:
    """The points as a DataFrame with the results.csv columns (config kept in sweep order)."""
    import pandas as pd

    rows = [{name: getattr(r, name) for name in RESULT_COLUMNS} for r in results]
    frame = pd.DataFrame(rows, columns=list(RESULT_COLUMNS))
    order = list(dict.fromkeys(frame["config"]))
    frame["config"] = pd.Categorical(frame["config"], categories=order, ordered=True)
    return frame


CURVE_COLUMNS = ("output_throughput", "request_throughput", "ttft_p50_ms", "ttft_p99_ms",
                 "itl_p50_ms", "itl_p99_ms", "e2e_p50_s", "e2e_p99_s", "peak_token_usage",
                 "mean_running", "max_running", "mean_queued", "cache_hit_rate")


def curves_frame(results: Sequence[PointResult]) -> pd.DataFrame:
    """One row per configuration and concurrency over the finished points (repeats
    averaged): the figures the throughput, latency and usage plots draw."""
    frame = results_frame([r for r in results if r.ok and isinstance(r.concurrency, int)])
    if frame.empty:
        return frame[["config", "concurrency", *CURVE_COLUMNS]]
    curves = frame.groupby(["config", "concurrency"], observed=True, sort=True)[
        list(CURVE_COLUMNS)].mean().reset_index()
    curves["config"] = curves["config"].cat.set_categories(
        list(dict.fromkeys(r.config for r in results)), ordered=True)
    return curves.sort_values(["config", "concurrency"], ignore_index=True)


def configs_frame(results: Sequence[PointResult]) -> pd.DataFrame:
    """One row per configuration: status (ok when a point ran), KV capacity, KV dtype,
    arguments and, for a failed one, the first failure's reason."""
    import pandas as pd

    rows = []
    for name in dict.fromkeys(r.config for r in results):
        points = [r for r in results if r.config == name]
        ok = [r for r in points if r.ok]
        first = (ok or points)[0]
        rows.append({"config": name, "status": "ok" if ok else "failed",
                     "max_total_num_tokens": first.max_total_num_tokens,
                     "kv_cache_dtype": first.kv_cache_dtype,
                     "args": json.dumps(first.args, sort_keys=True),
                     "reason": None if ok else first.reason})
    frame = pd.DataFrame(rows, columns=["config", "status", "max_total_num_tokens",
                                        "kv_cache_dtype", "args", "reason"])
    frame["config"] = pd.Categorical(frame["config"], categories=list(frame["config"]),
                                     ordered=True)
    return frame


def sweep_overview(out: str | os.PathLike[str]) -> dict[str, Any]:
    """The facts a report header shows about a sweep directory."""
    root = Path(out)
    record = _read_sweep_record(root) or {}
    params = record.get("params", {})
    server = params.get("server", {})
    load = params.get("load", {})
    launcher = server.get("launcher", "-")
    if launcher == "sim":
        sim = server.get("sim", {})
        launcher = f"simulator, profile {sim.get('profile')}, speed {sim.get('speed')}"
    results = load_results(root)
    return {
        "name": params.get("name", root.name), "out": str(root.resolve()),
        "launcher": launcher, "model": server.get("model_path") or "-",
        "configs": len(record.get("configs", [])), "points": len(record.get("points", [])),
        "finished": len(results), "failed": sum(1 for r in results if not r.ok),
        "concurrency": load.get("concurrency", []), "stream": load.get("stream"),
        "created": record.get("created"),
    }
