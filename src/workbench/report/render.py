"""Reports: parameterized notebooks executed with papermill, exported to offline HTML.

``run_report(name, params_file, overrides, out_dir)`` executes ``notebooks/NAME.ipynb`` and
writes ``OUT_DIR/NAME-<YYYYmmdd-HHMMSS>/NAME.ipynb`` (the executed notebook) and
``NAME.html`` (code hidden, plotly.js inlined once, so it opens without a network);
``OUT_DIR/NAME-latest`` links to the newest finished one, and ``OUT_DIR/index.html`` lists
every rendering (:mod:`workbench.report.index`; rewritten after each, failed ones too).

Parameters are :mod:`workbench.report.parameters`'s: checked, path ones made absolute,
before any kernel starts; the run folders and the tokenizer they name must exist. The
kernel runs in the notebook's folder, so the notebook's own defaults mean what they mean in
JupyterLab. What the report was made from is recorded beside it
(:mod:`workbench.report.provenance`; ``--rerun`` makes it again).

Execution. The kernel is ipykernel on this very interpreter (whatever kernelspecs are
installed), over local sockets in Jupyter's runtime folder (TCP on 127.0.0.1 on Windows, or
where a socket's path there would be too long: :func:`socket_folder`). A cell that raises or times out (or a kernel that dies) stops the run with
ReportError naming the cell (its index in the source notebook and its first line) and the
exception; the executed notebook is kept. It is written once, when the run ends.

Values for tools and tests. Blocks built by :mod:`workbench.report.plots` carry the data they show
as JSON under the output mimetype ``application/vnd.workbench.data+json``; papermill records
it in the executed notebook, and :func:`cell_data` reads it back by cell tag: the
``summary`` cell of token_distribution holds ``workbench stats --json``, the ``validation``
cell of format_validation ``workbench validate --json``.
"""

from __future__ import annotations

import contextlib
import copy
import functools
import os
import sys
import time
import uuid
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from workbench.errors import ConfigError, ReportError, StorageError
from workbench.report import index, provenance
from workbench.report.jupyter import DATA_MIME, fast_jupyter_imports, report_kernel_env
from workbench.report.parameters import (
    DEMO_REPORTS,
    PATH_PARAMETERS,
    find_notebook,
    load_parameters,
    notebook_parameters,
    notebooks_dir,
    resolve_paths,
)
from workbench.resources import data_dir
from workbench.rundir.run import check_run_dir
from workbench.rundir.storage import DISK_ERRNOS, storage_error, writing
from workbench.tokenizer import check_tokenizer_dir

__all__ = [
    "DEFAULT_OUT",
    "SOCKET_PATH_MAX",
    "Planned",
    "ReportResult",
    "cell_data",
    "changes_since_latest",
    "demo_reports",
    "export_html",
    "link_latest",
    "plan_report",
    "rerun_report",
    "run_report",
    "socket_folder",
]

DEFAULT_OUT = Path("outputs/reports")

_TEMPLATE = """{%- extends 'lab/index.html.j2' -%}
{%- block html_head_js -%}{%- endblock html_head_js -%}
{%- block html_head_js_mathjax -%}{%- endblock html_head_js_mathjax -%}
{%- block html_head_js_mermaidjs -%}{%- endblock html_head_js_mermaidjs -%}
{%- block extra_css -%}<style type="text/css">
body.jp-Notebook { max-width: 1320px; margin: 0 auto; padding: 24px 32px 48px; background: #fff; }
.jp-Notebook .jp-Cell { padding: 0; }
.jp-RenderedHTMLCommon { font-family: Inter, -apple-system, 'Segoe UI', Helvetica, Arial, sans-serif;
  font-size: 14px; color: #1f2933; padding-right: 0; }
.jp-RenderedHTMLCommon h2 { font-size: 20px; margin: 28px 0 4px; padding-top: 14px;
  border-top: 1px solid #e4e7eb; font-weight: 650; }
.jp-RenderedHTMLCommon p { color: #3e4c59; max-width: 960px; }
.jp-RenderedMarkdown.jp-RenderedHTMLCommon { padding-left: 0; }
.jp-OutputArea-output { overflow-x: auto; }
.jp-OutputArea-output pre { font-size: 12px; }
</style>{%- endblock extra_css -%}
"""


@dataclass(frozen=True, slots=True)
class ReportResult:
    """Where a report was written, and the parameters it was given."""

    name: str
    html_path: Path
    notebook_path: Path
    parameters: Mapping[str, Any]
    seconds: Mapping[str, float] = field(default_factory=dict)  # "notebook", "html", "total"
    inputs_changed: bool | None = None  # since the previous rendering (None: the first)


SOCKET_PATH_MAX = 100  # bytes of a local socket's path: sun_path holds 108 (Linux), 104 (macOS)


def socket_folder() -> Path | None:
    """Jupyter's runtime folder, where a report kernel's local sockets go; None on Windows, or
    where a socket's path in it would be too long (a deep ``JUPYTER_RUNTIME_DIR``): TCP on
    127.0.0.1 then."""
    from jupyter_core.paths import jupyter_runtime_dir

    if sys.platform == "win32":
        return None
    folder = Path(jupyter_runtime_dir())
    longest = folder / f"workbench-{'0' * 12}-ipc-99"  # the prefix below, a channel's number
    return folder if len(os.fsencode(longest)) <= SOCKET_PATH_MAX else None


def _kernel_manager_class() -> type:
    from jupyter_client.kernelspec import KernelSpec
    from jupyter_client.manager import AsyncKernelManager
    from traitlets import default

    class InterpreterKernelManager(AsyncKernelManager):  # type: ignore[misc]
        """ipykernel on the running interpreter, whatever kernelspecs are installed; over
        local sockets where there are (no TCP port, nothing to eavesdrop on)."""

        @default("transport")
        def _default_transport(self) -> str:
            return "ipc" if socket_folder() is not None else "tcp"

        @default("ip")
        def _default_ip(self) -> str:
            folder = socket_folder() if self.transport == "ipc" else None
            if folder is None:
                return "127.0.0.1"
            folder.mkdir(parents=True, exist_ok=True)
            return str(folder / f"workbench-{uuid.uuid4().hex[:12]}-ipc")  # socket path prefix

        async def _async_interrupt_kernel(self) -> None:
            """No SIGINT on the way out: jupyter_client interrupts before every shutdown,
            which only makes the kernel print ``[IPKernelApp] ERROR | KeyboardInterrupt
            caught in kernel`` into the report's output (the shutdown request stops it)."""
            if not self.shutting_down:
                await super()._async_interrupt_kernel()

        @property
        def kernel_spec(self) -> KernelSpec:
            if self._kernel_spec is None:
                self._kernel_spec = KernelSpec(
                    argv=[sys.executable, "-m", "ipykernel_launcher", "-f", "{connection_file}"],
                    display_name="Python (workbench)", language="python")
            return self._kernel_spec

    return InterpreterKernelManager


def _report_folder(out_dir: Path, name: str, now: float) -> Path:
    stamp = time.strftime("%Y%m%d-%H%M%S", time.localtime(now))
    with writing(out_dir):
        out_dir.mkdir(parents=True, exist_ok=True)
    for attempt in range(1, 1000):
        folder = out_dir / (f"{name}-{stamp}" if attempt == 1 else f"{name}-{stamp}-{attempt}")
        try:
            folder.mkdir()
            return folder
        except FileExistsError:
            continue
    raise ReportError(f"{out_dir}: cannot create a report folder for {name}")


def link_latest(folder: Path, name: str) -> Path | None:
    """Point ``<name>-latest`` next to a finished report folder at it (a relative symlink,
    replaced atomically); None where symlinks cannot be made."""
    link = folder.parent / f"{name}-latest"
    temporary = folder.parent / f".{name}-latest.{uuid.uuid4().hex[:8]}"
    try:
        temporary.symlink_to(folder.name, target_is_directory=True)
        os.replace(temporary, link)
    except OSError:
        temporary.unlink(missing_ok=True)
        return None
    return link


def _source_index(executed: Path, cell_index: int, cells: list[Any] | None = None) -> int:
    """The failing cell's index in the source notebook (papermill inserts one cell)."""
    fast_jupyter_imports()
    import nbformat

    cells = nbformat.read(executed, as_version=4).cells if cells is None else cells
    injected = [i for i, c in enumerate(cells) if "injected-parameters" in c.metadata.get("tags", [])]
    return cell_index - 1 if injected and injected[0] < cell_index else cell_index


def _cell(executed: Path, index: int, source: str, cells: list[Any] | None = None) -> str:
    """``cell N (its first line)``, N the cell's index in the source notebook."""
    first = next((line.strip() for line in source.splitlines() if line.strip()), "")
    return f"cell {_source_index(executed, index, cells)} ({first})"


def _failure(name: str, executed: Path, exc: Any) -> ReportError:
    return ReportError(f"{name}: {_cell(executed, exc.cell_index, str(exc.source))} raised "
                       f"{exc.ename}: {exc.evalue} (executed notebook: {executed})")


def _running_cell(executed: Path) -> str:
    """``cell N (its first line) `` of the last cell papermill started before the run
    stopped (a timeout, a dead kernel), else nothing."""
    import nbformat

    with contextlib.suppress(OSError, ValueError):
        cells = nbformat.read(executed, as_version=4).cells
        started = [i for i, cell in enumerate(cells) if cell.metadata.get("papermill", {}).get("start_time")]
        if started:
            return f"{_cell(executed, started[-1], cells[started[-1]].source, cells)} "
    return ""


@functools.cache
def _engine() -> str:
    """A papermill engine (registered once) that writes the executed notebook when the run
    ends, however it ends, instead of after every cell as papermill's default does: each
    save serializes and validates the whole notebook, plotly.js inlined in it (megabytes),
    which cost a report more than its data did."""
    from papermill.engines import NBClientEngine, papermill_engines
    from papermill.iorw import write_ipynb

    class SaveAtEnd(NBClientEngine):  # type: ignore[misc]
        @classmethod
        def execute_notebook(cls, nb: Any, kernel_name: str, output_path: str | None = None,
                             **kwargs: Any) -> Any:
            try:
                return super().execute_notebook(nb, kernel_name, output_path=None, **kwargs)
            except BaseException:  # a timeout, a dead kernel: keep what ran
                if output_path:
                    write_ipynb(nb, output_path)
                raise

    papermill_engines.register("workbench", SaveAtEnd)
    return "workbench"


def _execute(name: str, notebook: Path, executed: Path, parameters: Mapping[str, Any],
             timeout: float | None) -> Any:
    """The executed notebook (also written to `executed`)."""
    fast_jupyter_imports()
    import papermill
    from papermill.exceptions import PapermillExecutionError

    try:
        with report_kernel_env():
            return papermill.execute_notebook(
                str(notebook), str(executed), parameters=dict(parameters), kernel_name="python3",
                engine_name=_engine(), progress_bar=False, cwd=str(notebook.parent),
                execution_timeout=timeout, kernel_manager_class=_kernel_manager_class())
    except PapermillExecutionError as exc:
        raise _failure(name, executed, exc) from None
    except OSError as exc:
        if exc.errno in DISK_ERRNOS:  # the executed notebook could not be written
            raise storage_error(executed, exc) from None
        raise _stopped(name, executed, exc) from None
    except (RuntimeError, TimeoutError) as exc:  # a dead kernel, a cell timeout (nbclient's
        raise _stopped(name, executed, exc) from None  # errors derive from these)


def _stopped(name: str, executed: Path, exc: BaseException) -> ReportError:
    """A run that stopped without a failed cell: a dead kernel, a cell timeout, a kernel
    that would not start."""
    first = next((line for line in str(exc).splitlines() if line.strip()), "")
    return ReportError(f"{name}: {_running_cell(executed)}execution failed: "
                       f"{type(exc).__name__}: {first} (executed notebook: {executed})")


def export_html(notebook: Any, html_path: str | os.PathLike[str], title: str) -> Path:
    """An executed notebook (its path, or the notebook papermill returned) as one
    self-contained HTML page: code and prompts hidden, no script loaded from the network
    (figures carry plotly.js inline)."""
    fast_jupyter_imports()
    import jinja2
    import nbformat
    from nbconvert import HTMLExporter

    nb = notebook if isinstance(notebook, nbformat.NotebookNode) else nbformat.read(notebook, as_version=4)
    exporter = HTMLExporter(
        template_name="lab", exclude_input=True, exclude_input_prompt=True,
        exclude_output_prompt=True, extra_loaders=[jinja2.DictLoader({"workbench.html.j2": _TEMPLATE})],
        template_file="workbench.html.j2")
    body, _ = exporter.from_notebook_node(nb, resources={"metadata": {"name": title}})
    path = Path(html_path)
    path.write_text(body, encoding="utf-8")
    return path


@dataclass(frozen=True, slots=True)
class Planned:
    """A report as it would run now: its notebook, every parameter (defaults filled in,
    paths absolute; ``now`` left as given), the input files they name and the run read."""

    name: str
    notebook: Path
    parameters: Mapping[str, Any]
    files: list[tuple[str, Path]]
    run: str | None


def plan_report(
    name: str,
    params_file: str | os.PathLike[str] | None = None,
    overrides: Mapping[str, Any] | None = None,
    *,
    notebooks: str | os.PathLike[str] | None = None,
) -> Planned:
    """The report NAME with these parameters, checked (ConfigError, InputError as
    :func:`run_report`), nothing run or written."""
    notebook = find_notebook(name, Path(notebooks) if notebooks is not None else None)
    parameters = load_parameters(notebook, params_file, overrides)
    _check_inputs(parameters)
    completed = _complete(notebook, parameters, None)
    return Planned(name, notebook.resolve(), completed,
                   provenance.input_files(completed, PATH_PARAMETERS), provenance.run_of(completed))


def changes_since_latest(out_dir: str | os.PathLike[str], planned: Planned) -> list[Any] | None:
    """What changed (:class:`workbench.report.provenance.InputChange`, the notebook
    included) since the newest finished rendering of the same report and run in `out_dir`;
    None when there is none."""
    previous = index.latest_rendering(out_dir, planned.name, planned.run)
    if previous is None:
        return None
    try:
        manifest = provenance.read_manifest(previous.folder)
    except ConfigError:
        return None
    return provenance.changed_since(manifest, planned.notebook, planned.files)


def run_report(
    name: str,
    params_file: str | os.PathLike[str] | None = None,
    overrides: Mapping[str, Any] | None = None,
    out_dir: str | os.PathLike[str] = DEFAULT_OUT,
    *,
    notebooks: str | os.PathLike[str] | None = None,
    timeout: float | None = None,
) -> ReportResult:
    """Execute notebooks/NAME.ipynb with the parameters and export it to HTML.

    `timeout` bounds each cell (seconds; None: no bound). ConfigError for an unknown report
    or bad parameters and InputError for a `run_dir` that is not a run (both before any
    kernel starts or anything is written), ReportError when a cell fails. Whether it ran or
    failed, ``OUT_DIR/index.html`` is written again (:mod:`workbench.report.index`).
    """
    started, wall = time.perf_counter(), time.time()
    planned = plan_report(name, params_file, overrides, notebooks=notebooks)
    changes = changes_since_latest(out_dir, planned)
    parameters = _complete(planned.notebook, planned.parameters, wall)
    folder = _report_folder(Path(out_dir), name, wall)
    extra = {"run": planned.run, "inputs_changed": None if changes is None else bool(changes)}
    with writing(folder):
        provenance.write_parameters(folder, parameters, name)
        provenance.write_manifest(folder, name, planned.notebook, planned.files, wall, extra)
    executed = folder / f"{name}.ipynb"
    try:
        nb = _execute(name, planned.notebook, executed.resolve(), parameters, timeout)
    except BaseException as exc:  # a failed cell, Ctrl-C: said in report.json and the index
        _failed(folder, out_dir, exc)
        raise
    ran = time.perf_counter()
    title = name.replace("_", " ").capitalize()
    with writing(folder):
        provenance.finish_manifest(folder, {"cell_errors": _error_outputs(nb.cells)})
        html_path = export_html(nb, folder / f"{name}.html", title)
    link_latest(folder, name)
    index.write_index(out_dir)
    done = time.perf_counter()
    seconds = {"notebook": ran - started, "html": done - ran, "total": done - started}
    return ReportResult(name, html_path.resolve(), executed.resolve(), parameters, seconds,
                        None if changes is None else bool(changes))


def _error_outputs(cells: list[Any]) -> int:
    """Error outputs of an executed notebook's cells (those tagged raises-exception too)."""
    return sum(1 for cell in cells for out in cell.get("outputs", []) if out.get("output_type") == "error")


def _failed(folder: Path, out_dir: str | os.PathLike[str], exc: BaseException) -> None:
    """Record why a rendering stopped and list it in the index (never raising over `exc`)."""
    reason = str(exc) if isinstance(exc, ReportError) else f"stopped: {type(exc).__name__}"
    with contextlib.suppress(OSError, ConfigError, StorageError):
        provenance.record_failure(folder, reason)
        index.write_index(out_dir)


def _check_inputs(parameters: Mapping[str, Any]) -> None:
    """The given run folders and tokenizer exist (before a kernel starts): InputError or
    ConfigError naming the parameter."""
    for key in ("run_dir", "compare_run_dir"):
        if parameters.get(key) is not None:
            check_run_dir(parameters[key])
    if parameters.get("tokenizer") is not None:
        check_tokenizer_dir(parameters["tokenizer"])


def _complete(notebook: Path, given: Mapping[str, Any], started: float | None) -> dict[str, Any]:
    """Every parameter of the notebook as the report runs it: its defaults (path ones made
    absolute against the notebook's folder, where its kernel runs) under the given values;
    ``interactive`` off (a report is static); ``now`` pinned to the start when unset, so
    that running the same parameters again reproduces the report's numbers."""
    declared = notebook_parameters(notebook)
    defaults = resolve_paths({key: default for key, (_, default) in declared.items()}, notebook.resolve().parent)
    values = {**defaults, **given}
    if "interactive" in declared and "interactive" not in given:
        values["interactive"] = False
    if "now" in declared and values.get("now") is None and started is not None:
        values["now"] = started
    return values


def rerun_report(
    report_dir: str | os.PathLike[str], out_dir: str | os.PathLike[str] | None = None
) -> tuple[ReportResult, list[Any]]:
    """Run a report folder's executed notebook again with its params.yaml, into a new folder
    beside it (or in `out_dir`); also returns its inputs compared with the recorded ones
    (:class:`workbench.report.provenance.InputChange`, compared before running)."""
    folder = Path(report_dir)
    manifest = provenance.read_manifest(folder)
    name = str(manifest["report"])
    params = folder / provenance.PARAMS
    notebook = find_notebook(name, folder)
    now = provenance.input_files(load_parameters(notebook, params), PATH_PARAMETERS)
    changes = provenance.compare_inputs(manifest, now)
    result = run_report(name, params, None, out_dir if out_dir is not None else folder.parent,
                        notebooks=folder)
    return result, changes


def demo_reports(
    run_dir: str | os.PathLike[str], out_dir: str | os.PathLike[str] = DEFAULT_OUT
) -> list[ReportResult]:
    """The reports `workbench demo` writes after generating: DEMO_REPORTS with their
    ``params/NAME.demo.yaml`` files, ``run_dir`` set to the demo's run."""
    params = data_dir("params")
    run = {"run_dir": str(Path(run_dir).resolve())}
    return [run_report(name, params / f"{name}.demo.yaml", run, out_dir, notebooks=notebooks_dir())
            for name in DEMO_REPORTS]


def cell_data(notebook: str | os.PathLike[str], tag: str) -> Any:
    """The DATA_MIME payload of the executed cell tagged `tag` (its last one); KeyError if
    no such cell holds one."""
    fast_jupyter_imports()
    import nbformat

    nb = nbformat.read(notebook, as_version=4)
    for cell in nb.cells:
        if tag not in cell.get("metadata", {}).get("tags", []):
            continue
        payloads = [out["data"][DATA_MIME] for out in cell.get("outputs", [])
                    if DATA_MIME in out.get("data", {})]
        if payloads:
            return copy.deepcopy(payloads[-1])
    raise KeyError(f"{notebook}: no cell tagged {tag!r} with {DATA_MIME} output")
