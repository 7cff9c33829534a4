"""run.json while a run goes, and the events of its session.

What generate writes to run.json (through :mod:`workbench.rundir.manifest`, its one reader
and writer):

    manifest_record  the run as it stands: the server, the model, the options, the order
                     seed, the concurrency, the benchmarks, each dataset's entry
                     (dataset_record: its sampling, caps, order, context fit, dedup, and
                     whether its budget stopped it)
    RunManifest      that record written when the run opens, whenever the concurrency cap
                     moved (its history, for the monitor), when something happened (an
                     event) and when the run ends (which budgets stopped their dataset),
                     with this session's history entry and events

A write that fails while the run goes is said once and tried again next time, never the
end of the run. Events (``{"ts", "kind", "message", ...figures}``) are said and kept in
run.json's ``events``: the watchdog's detections (:mod:`workbench.generate.watchdog`: a
server that answers but generates nothing, or crawls; each is also passed to
``on_watchdog``), prompts the server cut (``prompt_mismatch``), a launched server's starts
and restarts (:mod:`workbench.generate.launched`).
"""

from __future__ import annotations

import dataclasses
import time
from collections.abc import Callable, Mapping
from pathlib import Path
from typing import Any

import msgspec

from workbench import __version__
from workbench.errors import StorageError
from workbench.generate.concurrency import Slots
from workbench.generate.dedup import dedup_record
from workbench.generate.plan import Plan, PlannedDataset, ServerFacts, limit
from workbench.generate.resume import modes_record
from workbench.generate.watchdog import Detection, WatchdogSettings
from workbench.rundir.manifest import (
    BenchmarkChoice,
    benchmarks_record,
    dataset_entries,
    with_events,
    with_session,
    write_manifest,
)

__all__ = ["RunManifest", "dataset_record", "manifest_record"]


def manifest_record(plan: Plan, server: ServerFacts, concurrency: Mapping[str, Any],
                    benchmarks: Mapping[str, Any] | None = None) -> dict[str, Any]:
    """run.json as it stands now (`concurrency`: the cap's record, `benchmarks` the
    record of the benchmarks looked for); the entries of datasets an earlier run wrote
    and this one does not send are kept."""
    datasets = dict(dataset_entries(plan.previous))
    for name, ds in plan.datasets.items():
        datasets[name] = dataset_record(plan, ds)
    return {
        "workbench_version": __version__,
        "created": plan.created,
        "updated": time.time(),
        "server_url": server.url,
        "model": server.model,
        "model_profile": plan.manifest.model_profile,
        "manifest_file": str(Path(plan.manifest.source).resolve()),
        "server_info": dict(server.info),
        "model_info": dict(server.model_info),
        "options": dataclasses.asdict(plan.options),
        "order_seed": plan.order_seed,
        "concurrency": dict(concurrency),
        "benchmarks": None if benchmarks is None else dict(benchmarks),
        "datasets": datasets,
    }


def dataset_record(plan: Plan, ds: PlannedDataset) -> dict[str, Any]:
    """One dataset's entry of run.json."""
    spec = ds.spec
    return {
        "path": spec.path, "input": spec.input, "prompts": len(ds.prompts),
        "max_samples": limit(spec.max_samples, plan.options.max_samples),
        "max_tokens": ds.progress.max_tokens,
        "sampling": msgspec.to_builtins(ds.sampling),
        "id_field": spec.id_field,
        "tokenizer": spec.tokenizer,
        "chat_template_kwargs": dict(spec.chat_template_kwargs),
        "budget_reached": ds.progress.budget_reached,
        "order": spec.order or "random",
        "context_fit": spec.context_fit,
        "context_fit_min_tokens": (spec.min_generation_tokens()
                                   if spec.context_fit == "reduce_generation" else None),
        "dedup": dedup_record(spec.dedup_mode(), plan.manifest.dedup_threshold, ds.skipped),
        "turns": spec.turns or "last",
        "tools_field": spec.tools_field,
        # turns: each: the turns its conversations ask for, less those of conversations that
        # ended early (stats' target; the prompts are its conversations)
        "target_turns": ds.progress.target if ds.progress.turns else None,
        "render": spec.render,
        "truncated": spec.truncated,
        "rendering": None if ds.rendering is None else ds.rendering.record(),
        # a dataset that mixes modes: its modes (each record names its own) and the
        # deployment sample they were taken from (None: written in the manifest)
        "modes": modes_record(spec),
        "modes_source": spec.modes_source,
    }


class RunManifest:
    """run.json of one run while it goes (module docstring). `server` is set when the run
    opens (nothing is written before), `benchmarks` when it loads; `sent` says whether
    this session sent a request; `watchdog` is the watchdog's settings when it is on."""

    def __init__(self, out: Path, plan: Plan, slots: Slots, sent: Callable[[], bool],
                 say: Callable[[str], None], watchdog: WatchdogSettings | None = None,
                 on_watchdog: Callable[[Detection], None] | None = None) -> None:
        self.out = out
        self.plan = plan
        self.slots = slots
        self.say = say
        self.watchdog = watchdog
        self.on_watchdog = on_watchdog  # every detection (e.g. to restart a stalled server)
        self.server: ServerFacts | None = None
        self.benchmarks = BenchmarkChoice()  # the benchmarks looked for (load)
        self.events: list[dict[str, Any]] = []  # this session's, for run.json
        self._sent = sent
        self._session = time.time()
        self._failed = False

    def write(self) -> None:
        """run.json now: this session's concurrency once it sent something (a session that
        sends nothing keeps the earlier one's), and this session's history entry."""
        assert self.server is not None
        mine = self.slots.record() if self._sent() else None
        earlier = self.plan.previous.get("concurrency")
        concurrency = mine if mine is not None or not isinstance(earlier, dict) else earlier
        record = manifest_record(self.plan, self.server, concurrency or self.slots.record(),
                                 benchmarks_record(self.benchmarks))
        watchdog = self.watchdog.record() if self.watchdog is not None else None
        record = with_session(record, self.plan.previous, self._session,
                              {"concurrency": mine, "watchdog": watchdog})
        write_manifest(self.out, with_events(record, self.plan.previous, self.events))

    def update(self) -> None:
        """run.json brought up to date while running: a failed write is said (once) and
        tried again next time, never the end of the run."""
        try:
            self.write()
        except StorageError as exc:
            if not self._failed:
                self.say(f"{exc} (run.json is written again later)")
            self._failed = True
        else:
            self._failed = False

    def add_event(self, event: dict[str, Any], *, said: bool = False) -> None:
        """An event (``{"ts", "kind", "message", ...figures}``): said (unless it was
        already), kept in run.json's events (written now when the run is open, else when it
        opens)."""
        self.events.append(event)
        if not said:
            self.say(event["message"])
        if self.server is not None:
            self.update()

    def watchdog_saw(self, detection: Detection) -> None:
        """A detection: an event, passed on to `on_watchdog`."""
        self.add_event(detection.event(time.time()))
        if self.on_watchdog is not None:
            self.on_watchdog(detection)
