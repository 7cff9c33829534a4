"""What a generation run sends: datasets, prompts, order, budgets, and the resume check.

Nothing here awaits: a :class:`Plan` is built and checked before any request is sent, and
bad input fails before anything is written.

- Datasets: the manifest's, or those of ``--only`` (ConfigError naming an unknown one).
- Prompts: every row of each dataset's file (:mod:`workbench.generate.prompts`); with a
  sample cap in file order, the first ones only.
- Order: a dataset's prompts go out in a seeded random order (``order: random``, the
  default; the seed is ``order_seed`` in run.json, kept on resume), or in file order
  (``order: file``), so a budget keeps a fair subset of a sorted or grouped file.
- Modes: a dataset that mixes ``modes`` draws each prompt's mode along the send order of all
  its rows (:func:`mode_draw`, :func:`workbench.modes.draw`) before rendering it with the
  mode's chat-template arguments; a resume keeps the modes prompts.jsonl recorded.
- Duplicates: a dataset with ``dedup: exact | near`` drops its copies of prompts that an
  earlier dataset of the manifest keeps, or an earlier row of its own, before the order and
  the sample cap (:mod:`workbench.generate.dedup`); they are written to ``skipped.jsonl``,
  never to prompts.jsonl. With ``--only``, the manifest's earlier datasets are read too (not
  sent): they may hold the kept copy.
- Budgets: ``max_samples`` takes the first prompts of the send order (plus any finished
  before: a resumed run keeps what it has); ``max_tokens`` is the dispatcher's to keep
  (:mod:`workbench.generate.feed`, :mod:`workbench.generate.budget`).
- Resume (the default): finished ``sample_id``s are not sent again; a torn last line is put
  aside (``raw_responses.jsonl.torn``), and so are lines that are no finished record
  (``.rejected``: their samples are sent again); a run made with another model or other
  sampling parameters, or whose finished samples were sent other prompts than the manifest
  builds now (:mod:`workbench.generate.resume`), is refused (ResumeMismatch; ``--force``
  resumes anyway, sending those samples again). ``--no-resume`` moves the earlier files
  aside (``*.bak``). A file that cannot be written is a StorageError naming it.
- Context fit: a dataset's ``context_fit`` (and ``context_fit_min_tokens``) is the
  dispatcher's to apply (:mod:`workbench.generate.context_fit`); run.json records both.
- run.json: the plan's record (its datasets, options, order seed) is built and written by
  :mod:`workbench.generate.run_manifest`, through :mod:`workbench.rundir.manifest`.
"""

from __future__ import annotations

import random
import time
from collections.abc import Callable, Iterator, Mapping
from contextlib import nullcontext
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, NamedTuple, TypeVar

import msgspec

from workbench.chat import generation_points
from workbench.config import CHAT_INPUTS, DatasetSpec, Manifest, Sampling
from workbench.errors import ConfigError, DataError, ResumeMismatch
from workbench.generate.conversations import Conversations
from workbench.generate.dedup import (
    Deduper,
    Skipped,
    dedup_line,
    dedup_record,
    mode_text,
    write_skipped,
)
from workbench.generate.progress import DatasetProgress
from workbench.generate.prompts import ModeDraw, Prompt, load_prompts
from workbench.generate.rendering import RenderingCheck
from workbench.generate.resume import (
    DatasetResume,
    TurnResume,
    check_settings,
    conflict_message,
    prompt_line,
    read_resume,
    recorded_modes,
)
from workbench.generate.turn_resume import read_turn_resume
from workbench.modes import draw
from workbench.profiles import ModelProfile, get_profile
from workbench.rundir.appender import move_lines_aside, repair_torn_tail
from workbench.rundir.files import (
    backup_path,
    copy_aside,
    same_content,
    set_aside,
    write_lines_atomic,
)
from workbench.rundir.layout import (
    PROMPTS_FILE,
    RAW_FILE,
    REJECTED_SUFFIX,
    TORN_SUFFIX,
    DatasetDir,
)
from workbench.rundir.line_index import span_reader
from workbench.rundir.manifest import dataset_entries, read_manifest
from workbench.rundir.records import SampleId
from workbench.rundir.storage import storage_error
from workbench.server.client import DEFAULT_REQUEST_TIMEOUT
from workbench.sketch import Template

__all__ = ["GenerateOptions", "Plan", "PlannedDataset", "ServerFacts", "limit", "mode_draw",
           "model_name", "send_order"]

T = TypeVar("T")


@dataclass(frozen=True, slots=True)
class GenerateOptions:
    """Run-wide settings; the CLI flags map one to one onto these fields."""

    concurrency: int | str | None = None  # N (a cap), "auto", None: the manifest's, else auto
    long_concurrency: int = 16
    long_threshold: int = 4096
    only: tuple[str, ...] = ()
    max_samples: int | None = None
    max_tokens_per_dataset: int | None = None
    max_new_tokens: int | None = None
    resume: bool = True
    force: bool = False
    max_attempts: int = 5
    backoff_base: float = 0.5
    backoff_cap: float = 30.0
    grace_period: float = 30.0
    progress_interval: float = 5.0
    seed: int | None = None
    request_timeout: float = DEFAULT_REQUEST_TIMEOUT
    preflight: bool = False
    server_wait: float = 3600.0
    disk_wait: float = 1800.0  # seconds a failed write may go on failing before the run stops
    auto_interval: float = 2.0  # seconds between two readings of the servers (auto)
    gpus: int | None = None  # the GPUs serving the run (None: from /server_info)
    # Benchmark files whose overlaps are kept as it writes; None: a resumed run's (run.json),
    # () none. Their prompt field (None: the run's, else the first known one) and n-gram
    # (None: the run's, else 13).
    decontaminate: tuple[str, ...] | None = None
    benchmark_field: str | None = None
    ngram: int | None = None


class ServerFacts(NamedTuple):
    """What run.json records of the server: its URL without credentials, the model it
    serves, its /server_info and /model_info."""

    url: str
    model: str
    info: Mapping[str, Any]
    model_info: Mapping[str, Any]


@dataclass(slots=True)
class PlannedDataset:
    """One dataset ready to send: this run's prompts (file order), those still to send
    (send order), its folder, its counters and the duplicates it skips."""

    spec: DatasetSpec
    sampling: Sampling
    folder: DatasetDir
    prompts: list[Prompt]
    pending: list[Prompt]
    progress: DatasetProgress
    skipped: list[Skipped] = field(default_factory=list)
    rendering: RenderingCheck | None = None  # a chat dataset's renderings compared
    modes: dict[str, Sampling] = field(default_factory=dict)  # each mode's sampling

    def sampling_of(self, prompt: Prompt) -> Sampling:
        """The sampling a prompt is sent with: its mode's, else the dataset's."""
        return self.modes.get(prompt.mode, self.sampling) if prompt.mode else self.sampling


class _Drawn(NamedTuple):
    """A dataset's share of the run: its prompts (file order), those to send (send order) and
    the duplicates it skips (and the template its near ones were compared without)."""

    prompts: list[Prompt]
    pending: list[Prompt]
    skipped: list[Skipped]
    template: Template | None = None


def send_order(prompts: list[T], order: str, seed: int, name: str) -> list[T]:
    """The prompts in the order they are sent: the file's, or shuffled by `seed` and the
    dataset's name (the same order for the same seed, whatever else the run holds; the
    shuffle depends on their number only, so their ids go in the same order)."""
    ordered = list(prompts)
    if order != "file":
        random.Random(f"{seed}/{name}").shuffle(ordered)
    return ordered


def mode_draw(spec: DatasetSpec, seed: Callable[[], int],
              earlier: Path | None) -> ModeDraw | None:
    """For a dataset that mixes modes, the draw of its prompts' modes
    (:func:`workbench.modes.draw`) along their send order (every row's, as `seed()`, the
    run's order seed, and the rows read give it); the modes an earlier session recorded in
    the prompts.jsonl at `earlier` (on resume) are kept. None for a dataset of one mode."""
    modes = spec.mode_list()
    if not modes:
        return None

    def drawn(ids: list[SampleId]) -> dict[SampleId, str]:
        order_seed = seed()
        order = send_order(ids, spec.order or "random", order_seed, spec.name)
        names = {mode.name: i for i, mode in enumerate(modes)}
        recorded = recorded_modes(earlier) if earlier is not None else {}
        fixed = {k: names[name] for k, name in recorded.items() if name in names}
        picks = draw(order, [mode.weight for mode in modes], f"{order_seed}/{spec.name}/modes",
                     fixed)
        return {sample_id: modes[i].name for sample_id, i in picks.items()}

    return drawn


def model_name(server_info: Mapping[str, Any], model_info: Mapping[str, Any]) -> str:
    """The served model as run.json records it."""
    return str(model_info.get("model_path") or server_info.get("model_path") or "unknown")


def limit(*values: int | None) -> int | None:
    """The smallest of the limits given (None: no limit)."""
    present = [v for v in values if v is not None]
    return min(present) if present else None


def _on_file(path: Path, work: Callable[..., T], *args: Any) -> T:
    """work(*args), a failed write of it a StorageError naming path (an OSError of a write
    names no file)."""
    try:
        return work(*args)
    except OSError as exc:
        raise storage_error(exc.filename or path, exc) from None


def _write_prompts(folder: DatasetDir, prompts: list[Prompt], pending: list[Prompt],
                   state: DatasetResume) -> None:
    """prompts.jsonl of this run, written whole; left as it is when it holds just that (a
    resume then needs no room for a second copy). StorageError naming it when it cannot be
    written."""
    path = folder.prompts_path

    def lines() -> Iterator[bytes]:
        if state.turns is None:
            return _prompt_lines(folder, prompts, state)
        return _turn_prompt_lines(folder, prompts, pending, state.turns)

    try:
        if not same_content(path, lines()):
            write_lines_atomic(path, lines())
    except OSError as exc:
        raise storage_error(path, exc) from None


def _turn_prompt_lines(folder: DatasetDir, prompts: list[Prompt], pending: list[Prompt],
                       turns: TurnResume) -> Iterator[bytes]:
    """prompts.jsonl of a turns: each dataset: the lines of every finished turn as they were
    sent, in their order in the file (a session with nothing left rewrites nothing), then the
    next turn's of each pending conversation (file order; one the server renders is written
    when its reply comes)."""
    kept = sorted((span for spans in turns.spans.values() for span in spans),
                  key=lambda span: span.offset)
    with span_reader(folder.prompts_path) if kept else nullcontext(None) as read:
        yield from map(read, kept)
    going_on = {p.sample_id: p for p in pending}
    for prompt in prompts:
        following = going_on.get(prompt.sample_id)
        if following is not None and following.digest is None:
            yield prompt_line(following)


def _count_turns(progress: DatasetProgress, prompts: list[Prompt], pending: list[Prompt],
                 turns: TurnResume) -> None:
    """A turns: each dataset counts turns: those finished, and as its target those plus
    the turns its pending conversations ask for (lowered as conversations end early)."""
    ours = {p.sample_id for p in prompts}
    progress.turns = True
    progress.done = sum(n for sample_id, n in turns.turns.items() if sample_id in ours)
    progress.completion_tokens = sum(n for sample_id, n in turns.tokens.items()
                                     if sample_id in ours)
    progress.target = progress.done + sum(
        generation_points(p.chat, "each") - (p.turn or 0) for p in pending if p.chat is not None)


def _prompt_lines(folder: DatasetDir, prompts: list[Prompt],
                  state: DatasetResume) -> Iterator[bytes]:
    """prompts.jsonl of this run: its prompts in file order, each finished sample's as it was
    sent (its old line), then the old lines of finished samples this run does not send. A
    prompt the server renders (``render: server``) is written when its reply comes."""
    if not state.sent:
        yield from (prompt_line(p) for p in prompts if p.digest is None)
        return
    with span_reader(folder.prompts_path) as read:
        for prompt in prompts:
            span = state.sent.get(prompt.sample_id) if prompt.sample_id in state.done else None
            if span is not None:
                yield read(span)
            elif prompt.digest is None:  # a prompt the server renders: written when sent
                yield prompt_line(prompt)
        ours = {p.sample_id for p in prompts}
        for sample_id in state.done:
            span = state.sent.get(sample_id)
            if sample_id not in ours and span is not None:
                yield read(span)


class Plan:
    """The datasets of one run and what to send of each (see the module docstring).

    Call :meth:`load`, then :meth:`check_resume`, then :meth:`open` (which writes the
    dataset folders); `say` gets one line for each thing done to an earlier run's files.
    """

    def __init__(self, manifest: Manifest, out: Path, options: GenerateOptions,
                 say: Callable[[str], None] = lambda message: None) -> None:
        self.manifest = manifest
        self.out = out
        self.options = options
        self.say = say
        self.order_seed = 0
        self._seed: int | None = None  # the order seed, once a dataset that mixes modes drew
        self.created = 0.0
        self.previous: dict[str, Any] = {}
        self.datasets: dict[str, PlannedDataset] = {}
        self.vocab_size: int | None = None  # the model profile's: replies are checked against it
        # The conversations of turns: each datasets, across sessions (turn_resume) and turns.
        self.conversations = Conversations(get_profile(manifest.model_profile))
        self._resumes: dict[str, DatasetResume] = {}
        self._loaded: list[tuple[DatasetSpec, Sampling, list[Prompt]]] = []
        # Datasets read only to find duplicates (earlier in the manifest than a selected one
        # with dedup on, not selected themselves): their prompts, by name.
        self._references: dict[str, list[Prompt]] = {}

    def selected_specs(self) -> list[DatasetSpec]:
        """The manifest's datasets, narrowed to ``--only``."""
        specs = self.manifest.datasets
        if not self.options.only:
            return list(specs)
        names = {s.name for s in specs}
        unknown = [n for n in self.options.only if n not in names]
        if unknown:
            known = ", ".join(sorted(names))
            raise ConfigError("--only", f"unknown dataset {unknown[0]!r} (known: {known})")
        return [s for s in specs if s.name in self.options.only]

    def load(self) -> None:
        """Load every dataset's prompts, and those of the earlier datasets dedup compares
        them with (bad input fails here, before any server is asked)."""
        profile = get_profile(self.manifest.model_profile)
        self.vocab_size = profile.vocab_size
        selected = self.selected_specs()
        self._loaded = [(spec, self._sampling(spec), self._prompts(spec, profile))
                        for spec in selected]
        names = {spec.name for spec in selected}
        self._references = {spec.name: self._prompts(spec, profile)
                            for spec in self._dedup_specs() if spec.name not in names}

    def _dedup_specs(self) -> list[DatasetSpec]:
        """The datasets dedup goes through, in manifest order: every one up to the last
        selected one with dedup on (any earlier one may hold the kept copy); [] when no
        selected dataset has dedup on."""
        selected = {spec.name for spec in self.selected_specs()}
        specs = self.manifest.datasets
        last = max((i for i, spec in enumerate(specs)
                    if spec.name in selected and spec.dedup_mode() != "off"), default=-1)
        return specs[:last + 1]

    def _sampling(self, spec: DatasetSpec, mode: str | None = None) -> Sampling:
        """The dataset's sampling (with its mode's overrides), ``--max-new-tokens`` over it."""
        sampling = self.manifest.mode_sampling(spec, mode)
        if self.options.max_new_tokens is not None:
            sampling = msgspec.structs.replace(sampling, max_new_tokens=self.options.max_new_tokens)
        return sampling

    def _prompts(self, spec: DatasetSpec, profile: ModelProfile) -> list[Prompt]:
        """With a sample cap in file order, the first prompts; else the whole file (a cap
        in random order draws from all of it, and one after dedup from what is left)."""
        cap = limit(spec.max_samples, self.options.max_samples)
        earlier = self.out / spec.name / PROMPTS_FILE if self.options.resume else None
        modes = mode_draw(spec, self._mode_seed, earlier)
        if not self._whole_file(spec):
            return load_prompts(spec, profile, limit=cap, modes=modes)
        return load_prompts(msgspec.structs.replace(spec, max_samples=None), profile,
                            modes=modes)

    def _mode_seed(self) -> int:
        """The run's order seed, fixed before the first dataset that mixes modes is drawn
        (its draw follows the send order)."""
        if self._seed is None:
            self.previous = read_manifest(self.out)
            self._seed = self._order_seed()
        return self._seed

    def _whole_file(self, spec: DatasetSpec) -> bool:
        """Whether every row of the dataset's file is loaded (all but a file-order cap's)."""
        cap = limit(spec.max_samples, self.options.max_samples)
        return spec.order != "file" or cap is None or spec.dedup_mode() != "off"

    def first_prompt(self) -> Prompt | None:
        """The first loaded prompt (for a preflight request), if any."""
        return next((prompts[0] for _spec, _sampling, prompts in self._loaded if prompts), None)

    def server_rendered(self) -> list[tuple[DatasetSpec, Sampling, Prompt]]:
        """Each loaded dataset the server renders (``render: server``), with its first prompt."""
        return [(spec, sampling, prompts[0]) for spec, sampling, prompts in self._loaded
                if spec.render == "server" and prompts]

    def check_resume(self, model: str) -> None:
        """ResumeMismatch when the run in `out` was made with another model or sampling, or
        its finished samples were sent other prompts (unless ``--force``); nothing is written."""
        if not self.options.resume or not self.out.is_dir():
            return
        previous = read_manifest(self.out)
        if previous and not self.options.force:
            check_settings(self.out, previous, model, self._loaded)
        for spec, _sampling, prompts in self._loaded:
            state = self._resume_state(spec, prompts)
            if state.conflicts and not self.options.force:
                raise ResumeMismatch(conflict_message(spec.name, state, spec.path))

    def _resume_state(self, spec: DatasetSpec, prompts: list[Prompt]) -> DatasetResume:
        """What the dataset's folder holds (read once, before anything is written)."""
        if spec.name not in self._resumes:
            folder = DatasetDir(spec.name, self.out / spec.name)
            cap = limit(spec.max_samples, self.options.max_samples)
            complete = self._whole_file(spec) or cap is None or len(prompts) < cap
            try:
                self._resumes[spec.name] = (
                    read_turn_resume(folder, spec, prompts, complete, self.conversations)
                    if spec.turns == "each" else read_resume(folder, prompts, complete))
            except OSError as exc:
                raise DataError(exc.filename or folder.folder,
                                f"cannot read: {exc.strerror or exc}") from None
        return self._resumes[spec.name]

    def open(self) -> list[PlannedDataset]:
        """Prepare every dataset folder (after :meth:`load`): earlier files moved aside
        (no resume) or their torn tails and rejected lines put aside, finished ids read,
        duplicates found (once every folder's finished ids are known), prompts.jsonl and
        skipped.jsonl written. StorageError naming the file that cannot be written."""
        try:
            self.out.mkdir(parents=True, exist_ok=True)
        except OSError as exc:
            raise storage_error(self.out, exc) from None
        self.previous = read_manifest(self.out)
        created = self.previous.get("created")
        self.created = created if isinstance(created, int | float) else time.time()
        self.order_seed = self._seed if self._seed is not None else self._order_seed()
        folders = {spec.name: DatasetDir(spec.name, self.out / spec.name)
                   for spec, _sampling, _prompts in self._loaded}
        states: dict[str, DatasetResume] = {}
        for spec, _sampling, prompts in self._loaded:
            folder = folders[spec.name]
            try:
                states[spec.name] = self._prepare_folder(folder, spec, prompts)
            except OSError as exc:
                raise storage_error(exc.filename or folder.folder, exc) from None
        drawn = self._draw_all(states)
        for spec, sampling, _prompts in self._loaded:
            folder = folders[spec.name]
            try:
                self.datasets[spec.name] = self._open_dataset(
                    folder, spec, sampling, states[spec.name], drawn[spec.name])
            except OSError as exc:
                raise storage_error(exc.filename or folder.folder, exc) from None
        return list(self.datasets.values())

    def _order_seed(self) -> int:
        """The previous run's seed on resume (the same order, the same subset), else
        ``options.seed``, else a fresh one."""
        seed = self.previous.get("order_seed") if self.options.resume else None
        if isinstance(seed, int):
            return seed
        if self.options.seed is not None:
            return self.options.seed
        return random.SystemRandom().randrange(2**31)

    def _prepare_folder(self, folder: DatasetDir, spec: DatasetSpec,
                        prompts: list[Prompt]) -> DatasetResume:
        """The dataset's folder made ready and what it holds of earlier sessions: earlier
        files moved aside (no resume), a torn tail and rejected lines put aside."""
        folder.folder.mkdir(parents=True, exist_ok=True)
        if not self.options.resume:
            for path in (folder.raw_path, folder.errors_path, folder.prompts_path,
                         folder.scores_path):  # the scores of the records moved aside
                moved = set_aside(path)
                if moved:
                    self.say(f"[{spec.name}] --no-resume: moved {path.name} to {moved.name}")
        torn = _on_file(folder.raw_path, repair_torn_tail, folder.raw_path)
        if torn:
            self.say(f"[{spec.name}] moved a torn last line ({torn} bytes) to {RAW_FILE}{TORN_SUFFIX}")
        state = self._resume_state(spec, prompts) if self.options.resume else DatasetResume()
        self._set_aside_records(folder, state)
        return state

    def _draw_all(self, states: Mapping[str, DatasetResume]) -> dict[str, _Drawn]:
        """Each dataset's share of the run, in manifest order: its duplicates of what the
        datasets before it keep (and of its own earlier rows) dropped, then its sample cap
        drawn; the datasets read only for dedup are drawn too (what they keep counts), with
        what their folders hold."""
        loaded = {spec.name: prompts for spec, _sampling, prompts in self._loaded}
        checked = {spec.name for spec in self._dedup_specs()}
        deduper = (Deduper(self.manifest.dedup_threshold,
                           near=any(self.manifest.dataset(name).dedup_mode() == "near"
                                    for name in checked))
                   if checked else None)
        drawn: dict[str, _Drawn] = {}
        for spec in self.manifest.datasets:
            prompts = loaded.get(spec.name, self._references.get(spec.name))
            if prompts is None:
                continue
            done = set(states[spec.name].done if spec.name in states
                       else self._resume_state(spec, prompts).done)
            skipped: list[Skipped] = []
            if deduper is not None and spec.name in checked:
                skipped = deduper.check(spec.name, spec.dedup_mode(), prompts, done)
                dropped = {s.sample_id for s in skipped}
                prompts = [p for p in prompts if p.sample_id not in dropped]
            every = loaded.get(spec.name, self._references.get(spec.name)) or []
            kept, pending = _subset(spec, prompts, done, every, self.order_seed,
                                    limit(spec.max_samples, self.options.max_samples))
            if deduper is not None and spec.name in checked:
                deduper.keep({p.sample_id for p in kept})
            template = deduper.templates.get(spec.name) if deduper is not None else None
            drawn[spec.name] = _Drawn(kept, pending, skipped, template)
        return drawn

    def _open_dataset(self, folder: DatasetDir, spec: DatasetSpec, sampling: Sampling,
                      state: DatasetResume, drawn: _Drawn) -> PlannedDataset:
        """The dataset's prompts.jsonl and skipped.jsonl written, its counters set."""
        prompts, pending, skipped, template = drawn
        if state.turns is not None:  # conversations an earlier session started go on
            pending = [state.turns.next.get(p.sample_id, p) for p in pending]
        _write_prompts(folder, prompts, pending, state)
        _on_file(folder.skipped_path, write_skipped, folder, skipped)
        self._say_dedup(spec, folder, skipped, template)
        progress = DatasetProgress(
            name=spec.name, target=len(prompts),
            max_tokens=limit(spec.max_tokens, self.options.max_tokens_per_dataset),
            done=sum(1 for p in prompts if p.sample_id in state.done),
            completion_tokens=sum(state.done.values()))
        if state.turns is not None:
            _count_turns(progress, prompts, pending, state.turns)
        earlier = dataset_entries(self.previous).get(spec.name, {}).get("rendering")
        rendering = (RenderingCheck.resumed(spec.name, spec.render, earlier)
                     if spec.input in CHAT_INPUTS else None)
        modes = {mode.name: self._sampling(spec, mode.name) for mode in spec.mode_list()}
        return PlannedDataset(spec, sampling, folder, prompts, pending, progress, skipped,
                              rendering, modes)

    def _say_dedup(self, spec: DatasetSpec, folder: DatasetDir, skipped: list[Skipped],
                   template: Template | None) -> None:
        """What dedup skips of the dataset, and a mode changed since the earlier session."""
        name, mode = spec.name, spec.dedup_mode()
        record = dedup_record(mode, self.manifest.dedup_threshold, skipped)
        earlier = dataset_entries(self.previous).get(name)
        if earlier is not None and mode_text(earlier.get("dedup")) != mode_text(record):
            self.say(f"[{name}] dedup changed from {mode_text(earlier.get('dedup'))} to "
                     f"{mode_text(record)} since the earlier session: duplicates found anew, "
                     "finished samples kept")
        if mode != "off":
            listed = f" (listed in {folder.skipped_path})" if skipped else ""
            self.say(f"[{name}] {dedup_line(skipped, template if mode == 'near' else None)}{listed}")

    def _set_aside_records(self, folder: DatasetDir, state: DatasetResume) -> None:
        """Move the rejected lines to ``.rejected`` and, with --force, the records of samples
        whose prompt changed or whose row is gone to a ``.bak`` (prompts.jsonl copied
        beside it); those samples are then no longer done."""
        name, raw = folder.name, folder.raw_path
        moves = dict.fromkeys(state.rejected, raw.with_name(raw.name + REJECTED_SUFFIX))
        forced = state.conflicts if self.options.force else []
        if forced:
            backup = backup_path(raw)
            moves.update(dict.fromkeys(state.record_lines(forced), backup))
            copied = copy_aside(folder.prompts_path)
            self.say(f"[{name}] --force: {len(forced)} finished samples no longer match their "
                     f"prompt; their records moved to {backup.name}"
                     + (f" (the prompts they were sent: {copied.name})" if copied else ""))
            for sample_id in forced:
                state.done.pop(sample_id, None)
                state.sent.pop(sample_id, None)
                if state.turns is not None:
                    state.turns.forget(sample_id)
        moved = _on_file(raw, move_lines_aside, raw, moves)
        if state.rejected:
            self.say(f"[{name}] {len(state.rejected)} lines are no finished record (unreadable, a "
                     f"field missing, aborted): moved to {raw.name}{REJECTED_SUFFIX}, their "
                     "samples are sent again")
        assert moved == len(moves)


def _subset(spec: DatasetSpec, prompts: list[Prompt], done_ids: set[SampleId],
            every: list[Prompt], seed: int,
            cap: int | None) -> tuple[list[Prompt], list[Prompt]]:
    """(the dataset's prompts of this run in file order, those still to send in send
    order): a sample cap keeps the first ones of the send order, plus any finished
    before (a resumed run keeps what it has). A dataset that mixes modes keeps the order
    its modes were drawn along (that of `every` row loaded, less the duplicates skipped),
    so what a budget sends keeps their weights."""
    order = spec.order or "random"
    if spec.mode_list() and len(every) > len(prompts):
        ours = {p.sample_id for p in prompts}
        ordered = [p for p in send_order(every, order, seed, spec.name) if p.sample_id in ours]
    else:
        ordered = send_order(prompts, order, seed, spec.name)
    if cap is None or cap >= len(prompts):
        return prompts, [p for p in ordered if p.sample_id not in done_ids]
    kept = {p.sample_id for p in ordered[:cap]} | done_ids
    done = sum(1 for p in prompts if p.sample_id in done_ids)
    pending = [p for p in ordered if p.sample_id in kept and p.sample_id not in done_ids]
    return [p for p in prompts if p.sample_id in kept], pending[:max(0, cap - done)]
