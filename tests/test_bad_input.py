"""Bad input for every verb: one line naming the file and line (or key, or URL), exit 2.

Each case runs `python -m workbench ...` in a fresh copy of a finished run and checks that
stderr is exactly one `workbench: error:` line with no traceback, that the line names what
is wrong, and that no file of the directory changed (every file hashed before and after).
Property tests feed arbitrary JSON lines to the readers, validation, stats and export.
"""

from __future__ import annotations

import hashlib
import http.server
import json
import os
import shutil
import subprocess
import sys
import tempfile
import threading
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest
from conftest import EXAMPLES, SIM_FLAGS, workbench
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from workbench.analyze.rules import RecordChecker
from workbench.analyze.stats import collect_stats
from workbench.analyze.stats_text import format_stats_table
from workbench.analyze.validate import format_report, validate_run
from workbench.demo import start_simulator
from workbench.errors import WorkbenchError
from workbench.export.exporter import export_run
from workbench.export.options import ExportOptions
from workbench.profiles import get_profile
from workbench.rundir.layout import CACHE_DIR
from workbench.rundir.reader import parse_lines
from workbench.rundir.records import PromptRecord, encode_line
from workbench.server.launch import ServerProcess, find_free_port

SAMPLING = {"temperature": 0.0, "max_new_tokens": 16}
NO_KEY_ENV = {k: v for k, v in os.environ.items() if k not in ("WORKBENCH_API_KEY", "SGLANG_API_KEY")}


# --- servers -----------------------------------------------------------------------------------


def _fake_handler(mode: str) -> type[http.server.BaseHTTPRequestHandler]:
    """Answers every path like a misconfigured endpoint: an HTML error page, an HTML home
    page, or JSON that is not SGLang's."""

    class Handler(http.server.BaseHTTPRequestHandler):
        def log_message(self, *args: Any) -> None:
            pass

        def do_GET(self) -> None:
            self._answer()

        def do_POST(self) -> None:
            self.rfile.read(int(self.headers.get("Content-Length") or 0))
            self._answer()

        def _answer(self) -> None:
            if mode == "html_502":
                self._send(502, "text/html", "<html><body><h1>502 Bad Gateway</h1>\n<hr>nginx</body></html>")
            elif mode == "html_200":
                self._send(200, "text/html", "<!DOCTYPE html>\n<html><body>It works!</body></html>")
            elif self.path.endswith("_info"):
                self._send(200, "application/json", json.dumps({"status": "ok"}))
            else:
                self._send(200, "application/json", json.dumps({"choices": [{"text": "hi"}]}))

        def _send(self, status: int, kind: str, body: str) -> None:
            data = body.encode()
            self.send_response(status)
            self.send_header("Content-Type", kind)
            self.send_header("Content-Length", str(len(data)))
            self.end_headers()
            self.wfile.write(data)

    return Handler


@pytest.fixture(scope="module")
def fake_servers() -> Iterator[dict[str, str]]:
    servers = {}
    for mode in ("html_502", "html_200", "not_sglang"):
        server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), _fake_handler(mode))
        threading.Thread(target=server.serve_forever, daemon=True).start()
        servers[mode] = server
    yield {mode: f"http://127.0.0.1:{s.server_address[1]}" for mode, s in servers.items()}
    for server in servers.values():
        server.shutdown()


@pytest.fixture(scope="module")
def sims(tmp_path_factory: pytest.TempPathFactory,
         shared_sim: ServerProcess) -> Iterator[dict[str, ServerProcess]]:
    """The worker's simulator, and one that asks for an API key."""
    keyed = start_simulator(tmp_path_factory.mktemp("sims") / "keyed.log",
                            {**SIM_FLAGS, "api_key": "s3cret-key"})
    try:
        yield {"open": shared_sim, "keyed": keyed}
    finally:
        keyed.stop()


@pytest.fixture(scope="module")
def finished_run(tmp_path_factory: pytest.TempPathFactory, sims: dict[str, ServerProcess]) -> Path:
    """A finished run of two small datasets (ids and text; the first six rows of each file),
    made once for the module."""
    folder = tmp_path_factory.mktemp("finished")
    manifest = _manifest(folder, [
        {"name": "a", "path": str(EXAMPLES / "data/pretokenized.jsonl"), "input": "input_ids", "max_samples": 6},
        {"name": "b", "path": str(EXAMPLES / "data/texts.jsonl"), "input": "text", "max_samples": 6},
    ], order="file")
    done = workbench("generate", "--datasets", str(manifest), "--server", sims["open"].url,
                     "--out", str(folder / "run"))
    assert done.returncode == 0, done.stderr
    return folder / "run"


def _manifest(folder: Path, datasets: list[dict[str, Any]], name: str = "datasets.yaml",
              **top: Any) -> Path:
    body = {"model_profile": "kimi-k2.5", "sampling": SAMPLING, "datasets": datasets, **top}
    path = folder / name
    path.write_text(json.dumps(body, indent=1))
    return path


# --- the environment of one case -------------------------------------------------------------


@dataclass
class Env:
    """A case's directory: `run` is a copy of the finished run; servers by role."""

    root: Path
    run: Path
    servers: dict[str, str]

    def file(self, name: str, content: bytes | str) -> Path:
        path = self.root / name
        path.write_bytes(content.encode() if isinstance(content, str) else content)
        return path

    def prompts_manifest(self, lines: bytes | str, *, input: str = "input_ids", name: str = "a") -> tuple[Path, Path]:
        """A prompt file with these lines and a manifest whose dataset `name` reads it."""
        prompts = self.file("prompts-in.jsonl", lines)
        return _manifest(self.root, [{"name": name, "path": str(prompts), "input": input}]), prompts

    def yaml(self, text: str) -> Path:
        return self.file("params.yaml", text)

    def generate(self, manifest: Path, server: str = "open", *extra: str, out: Path | None = None) -> list[str]:
        return ["generate", "--datasets", str(manifest), "--server", self.servers.get(server, server),
                "--out", str(out or self.run), *extra]


def _snapshot(root: Path) -> dict[str, str]:
    """Every file of the run but the scan cache (which readers may write; see columns.py)."""
    return {
        str(path.relative_to(root)): hashlib.sha256(path.read_bytes()).hexdigest()
        for path in sorted(root.rglob("*")) if path.is_file() and CACHE_DIR not in path.parts
    }


@pytest.fixture
def env(tmp_path: Path, finished_run: Path, sims: dict[str, ServerProcess],
        fake_servers: dict[str, str]) -> Env:
    shutil.copytree(finished_run, tmp_path / "run")
    servers = {"open": sims["open"].url, "keyed": sims["keyed"].url, **fake_servers,
               "unreachable": f"http://127.0.0.1:{find_free_port()}"}
    return Env(tmp_path, tmp_path / "run", servers)


def assert_one_line_error(done: subprocess.CompletedProcess[str], *needles: str) -> str:
    lines = done.stderr.splitlines()
    assert "Traceback" not in done.stderr, done.stderr
    assert done.returncode == 2, (done.returncode, done.stderr)
    assert len(lines) == 1 and lines[0].startswith("workbench: error: "), done.stderr
    for needle in needles:
        assert needle in lines[0], (needle, lines[0])
    return lines[0]


# --- the table ---------------------------------------------------------------------------------

Build = Callable[[Env], tuple[list[str], list[str]]]
GOOD_IDS = '{"sample_id": 1, "input_ids": [5, 6, 7]}\n'


def _prompt_case(lines: str | bytes, needle_line: int | None, *words: str, input: str = "input_ids") -> Build:
    def build(env: Env) -> tuple[list[str], list[str]]:
        manifest, prompts = env.prompts_manifest(lines, input=input)
        where = f"{prompts}:{needle_line}:" if needle_line else str(prompts)
        return env.generate(manifest), [where, *words]
    return build


def _yaml_case(text: str, *needles: str) -> Build:
    def build(env: Env) -> tuple[list[str], list[str]]:
        path = env.yaml(text)
        return env.generate(path), [str(path), *needles]
    return build


def _dataset_case(entry: dict[str, Any], *needles: str) -> Build:
    def build(env: Env) -> tuple[list[str], list[str]]:
        good = env.file("good.jsonl", GOOD_IDS)
        path = _manifest(env.root, [{"name": "a", "path": str(good), "input": "input_ids", **entry}])
        return env.generate(path), [str(path), *needles]
    return build


def _server_case(role: str, *needles: str) -> Build:
    def build(env: Env) -> tuple[list[str], list[str]]:
        manifest, _ = env.prompts_manifest(GOOD_IDS)
        return env.generate(manifest, role, out=env.root / "fresh"), [env.servers[role], *needles]
    return build


def _run_case(verb: str, damage: Callable[[Env], Path | None], *needles: str,
              extra: Callable[[Env], list[str]] = lambda env: []) -> Build:
    """A run verb on the damaged run copy; needles may hold `{run}` and `{bad}` (the path
    `damage` returns)."""
    def build(env: Env) -> tuple[list[str], list[str]]:
        bad = damage(env)
        target = env.run if bad is None or bad.is_relative_to(env.run) else bad
        args = [verb, str(target), *extra(env)]
        return args, [n.format(run=env.run, bad=bad) for n in needles]
    return build


def _missing(env: Env) -> Path:
    return env.root / "no-such-run"


def _a_file(env: Env) -> Path:
    return env.file("not-a-dir.txt", "hello\n")


def _empty_dir(env: Env) -> Path:
    (env.root / "empty").mkdir()
    return env.root / "empty"


def _bad_run_json(env: Env) -> Path:
    path = env.run / "run.json"
    path.write_text('{\n  "model_profile": "kimi-k2.5",\n  oops\n}\n')
    return path


def _list_run_json(env: Env) -> Path:
    path = env.run / "run.json"
    path.write_text("[1, 2, 3]\n")
    return path


def _raw_is_a_dir(env: Env) -> Path:
    path = env.run / "a" / "raw_responses.jsonl"
    path.unlink()
    path.mkdir()
    (path / "keep").write_text("x")
    return path


def _bad_prompt_line(env: Env) -> Path:
    path = env.run / "a" / "prompts.jsonl"
    lines = path.read_bytes().splitlines(keepends=True)
    path.write_bytes(b"".join(lines[:2] + [b'{"sample_id": 2, "input_ids": [1,,2]}\n'] + lines[3:]))
    return path


def _duplicate_prompt(env: Env) -> Path:
    path = env.run / "a" / "prompts.jsonl"
    lines = path.read_bytes().splitlines(keepends=True)
    path.write_bytes(b"".join(lines[:3] + [lines[0]] + lines[4:]))
    return path


def _no_prompts(env: Env) -> Path:
    path = env.run / "a" / "prompts.jsonl"
    path.unlink()
    return path


def _unknown_profile(env: Env) -> Path:
    path = env.run / "run.json"
    data = json.loads(path.read_text())
    path.write_text(json.dumps({**data, "model_profile": "gpt-99"}))
    return path


def _nothing(env: Env) -> None:
    return None


def _export(damage: Callable[[Env], Path | None], *needles: str, to: str = "export.jsonl",
            extra: tuple[str, ...] = ("--only", "a")) -> Build:
    def args(env: Env) -> list[str]:
        return ["--to", to.format(root=env.root, run=env.run), *extra]
    return _run_case("export", damage, *needles, extra=args)


BIG_LINE_BYTES = 100 << 20


def _report_case(params: str, name: str | None, *needles: str, extra: tuple[str, ...] = (),
                 damage: Callable[[Env], Path | None] = lambda env: None) -> Build:
    def build(env: Env) -> tuple[list[str], list[str]]:
        damage(env)
        path = env.root / "absent.yaml" if params == "absent" else env.yaml(
            params.format(run=env.run, root=env.root))
        args = ["report", name or "token_distribution", "--params", str(path),
                "--out", str(env.root / "reports"), *extra]
        return args, list(needles)
    return build

CASES: list[Any] = [
    # generate: the manifest
    pytest.param(lambda env: (env.generate(env.root / "absent.yaml"), ["absent.yaml", "file not found"]),
                 id="generate-manifest-missing"),
    pytest.param(lambda env: (env.generate(env.root), [str(env.root), "cannot read"]),
                 id="generate-manifest-unreadable"),
    pytest.param(_yaml_case("", "empty file"), id="generate-manifest-empty"),
    pytest.param(_yaml_case("model_profile: kimi-k2.5\ndatasets:\n  - name: a\n   path: x\n", "line 4"),
                 id="generate-manifest-bad-yaml-line"),
    pytest.param(_yaml_case("model_profile: kimi-k2.5\nmodel_profile: qwen3\ndatasets: []\n", "line 2", "duplicate"),
                 id="generate-manifest-duplicate-key"),
    pytest.param(_yaml_case("- model_profile\n- datasets\n", "expected a mapping"),
                 id="generate-manifest-wrong-yaml-type"),
    pytest.param(_yaml_case("model_profile: kimi-k2.5\ndatasets: []\nsampling: {temprature: 1}\n",
                            "sampling.temprature", "unknown key"), id="generate-manifest-unknown-key"),
    pytest.param(_yaml_case("model_profile: kimi-k2.5\nworkers: 3\ndatasets: []\n", "workers", "unknown key"),
                 id="generate-manifest-unknown-top-key"),
    pytest.param(_yaml_case("model_profile: [kimi]\ndatasets: []\n", "model_profile", "expected str"),
                 id="generate-manifest-wrong-type"),
    pytest.param(_yaml_case("model_profile: gpt-99\ndatasets: [{name: a, path: x, input: text}]\n", "model_profile"),
                 id="generate-manifest-unknown-profile"),
    pytest.param(_dataset_case({"max_samples": "ten"}, "datasets[0].max_samples", "expected int"),
                 id="generate-dataset-wrong-type"),
    pytest.param(_dataset_case({"input": "tokens"}, "datasets[0].input", "input_ids"),
                 id="generate-dataset-bad-enum"),
    pytest.param(_dataset_case({"order": "sorted"}, "datasets[0].order", "file"),
                 id="generate-dataset-bad-order"),
    pytest.param(_yaml_case("model_profile: kimi-k2.5\nconcurrency: 0\ndatasets: []\n", "concurrency"),
                 id="generate-manifest-bad-concurrency"),
    pytest.param(_dataset_case({"colour": "red"}, "datasets[0].colour", "unknown key"),
                 id="generate-dataset-unknown-key"),
    pytest.param(_dataset_case({"sampling": {"temperature": -1}}, "datasets[0].sampling.temperature"),
                 id="generate-dataset-out-of-range"),
    pytest.param(_dataset_case({"name": "../../etc"}, "datasets[0].name", "not a safe directory name"),
                 id="generate-dataset-name-traversal"),
    pytest.param(_dataset_case({"name": "/tmp/evil"}, "datasets[0].name"), id="generate-dataset-name-absolute"),
    pytest.param(_dataset_case({"name": ".hidden"}, "datasets[0].name"), id="generate-dataset-name-dot"),
    pytest.param(_dataset_case({"path": "absent.jsonl"}, "datasets[0].path", "file not found"),
                 id="generate-dataset-file-missing"),
    pytest.param(_dataset_case({"path": "."}, "datasets[0].path", "not a regular file"),
                 id="generate-dataset-file-unreadable"),
    pytest.param(_dataset_case({"tokenizer": "no-such-dir"}, "datasets[0].tokenizer", "directory not found"),
                 id="generate-dataset-tokenizer-missing"),
    # generate: the prompt file
    pytest.param(_prompt_case("", None, "no prompts"), id="generate-prompts-empty"),
    pytest.param(_prompt_case("\n\n  \n", None, "no prompts"), id="generate-prompts-blank"),
    pytest.param(_prompt_case(GOOD_IDS * 1 + GOOD_IDS.replace("1", "2") + '{"sample_id": 3, "input_ids": [1,\n',
                              3, "invalid JSON"), id="generate-prompts-bad-json-line-3"),
    pytest.param(_prompt_case(GOOD_IDS + '{"input_ids": [1, 2]}\n', 2, "missing 'sample_id'"),
                 id="generate-prompts-no-id"),
    pytest.param(_prompt_case(GOOD_IDS + '{"sample_id": 2, "input_ids": [1]}\n' + GOOD_IDS, 3,
                              "duplicate sample_id 1", "line 1"), id="generate-prompts-duplicate-id"),
    pytest.param(_prompt_case(GOOD_IDS + '{"sample_id": 2.5, "input_ids": [1]}\n', 2, "sample_id"),
                 id="generate-prompts-float-id"),
    pytest.param(_prompt_case(GOOD_IDS + '{"sample_id": 2, "input_ids": "1 2 3"}\n', 2, "input_ids"),
                 id="generate-prompts-ids-wrong-type"),
    pytest.param(_prompt_case(GOOD_IDS + '{"sample_id": 2, "input_ids": [1, -4]}\n', 2, "input_ids[1]"),
                 id="generate-prompts-id-out-of-vocab"),
    pytest.param(_prompt_case('{"sample_id": 1, "text": 42}\n', 1, "text", input="text"),
                 id="generate-prompts-text-wrong-type"),
    pytest.param(_prompt_case(GOOD_IDS + "[1, 2, 3]\n", 2, "JSON object"), id="generate-prompts-not-object"),
    pytest.param(_prompt_case(b'{"sample_id": 1, "input_ids": [1]}\n\xff\xfe\x00garbage\n', 2, "invalid JSON"),
                 id="generate-prompts-binary"),
    pytest.param(_prompt_case(GOOD_IDS + '{"sample_id": 2, "text": "hi"}\n', 2, "missing 'input_ids'"),
                 id="generate-prompts-wrong-input-field"),
    # generate: the server and the options
    pytest.param(_server_case("unreachable", "cannot reach"), id="generate-server-unreachable"),
    pytest.param(_server_case("html_502", "HTTP 502"), id="generate-server-html-error-page"),
    pytest.param(_server_case("html_200", "not JSON"), id="generate-server-html-home-page"),
    pytest.param(_server_case("not_sglang", "/generate", "not SGLang's"), id="generate-server-json-not-sglang"),
    pytest.param(_server_case("keyed", "not authorised"), id="generate-server-needs-api-key"),
    pytest.param(lambda env: (["generate", "--datasets", str(env.prompts_manifest(GOOD_IDS)[0]),
                               "--server", env.servers["open"], "--out", str(env.file("f.txt", "x") / "out")],
                              ["--out", "f.txt"]), id="generate-out-is-a-file"),
    pytest.param(lambda env: (env.generate(env.prompts_manifest(GOOD_IDS)[0], "open", "--only", "zzz"),
                              ["--only", "'zzz'"]), id="generate-only-unknown"),
    # stats, validate, monitor, export: the run directory
    *(pytest.param(_run_case(verb, _missing, "{bad}", "not a run directory (no such directory)"),
                   id=f"{verb}-run-missing") for verb in ("stats", "validate", "monitor")),
    *(pytest.param(_run_case(verb, _a_file, "{bad}", "not a run directory (not a directory)"), id=f"{verb}-run-is-a-file")
      for verb in ("stats", "validate", "monitor")),
    *(pytest.param(_run_case(verb, _empty_dir, "{bad}", "not a run directory (no run.json and no "
                             "<dataset>/raw_responses.jsonl)"), id=f"{verb}-run-empty")
      for verb in ("stats", "validate")),
    *(pytest.param(_run_case(verb, _bad_run_json, "{bad}", "invalid JSON", "line 3"),
                   id=f"{verb}-run-json-bad-line-3") for verb in ("stats", "validate", "monitor")),
    *(pytest.param(_run_case(verb, _list_run_json, "{bad}", "JSON object"), id=f"{verb}-run-json-not-object")
      for verb in ("stats", "validate", "monitor")),
    *(pytest.param(_run_case(verb, _raw_is_a_dir, "{bad}", "not a regular file" if verb == "validate" else "cannot read"),
                   id=f"{verb}-raw-unreadable") for verb in ("stats", "validate", "monitor")),
    pytest.param(_run_case("validate", _unknown_profile, "{bad}", "model_profile", "gpt-99"),
                 id="validate-run-json-unknown-profile"),
    pytest.param(_run_case("validate", _nothing, "--model-profile", extra=lambda env: ["--model-profile", "nope"]),
                 id="validate-model-profile-unknown"),
    pytest.param(_run_case("validate", _nothing, "--only", "'zzz'", extra=lambda env: ["--only", "zzz"]),
                 id="validate-only-unknown"),
    pytest.param(_run_case("monitor", _nothing, "--interval", extra=lambda env: ["--interval", "-1"]),
                 id="monitor-interval-negative"),
    pytest.param(_export(_missing, "{bad}", "not a run directory (no such directory)"),
                 id="export-run-missing"),
    pytest.param(_export(_empty_dir, "{bad}", "not a run directory (no run.json and no "
                                             "<dataset>/raw_responses.jsonl)"), id="export-run-empty"),
    pytest.param(_export(_bad_run_json, "{bad}", "invalid JSON", "line 3"), id="export-run-json-bad-line-3"),
    pytest.param(_export(_raw_is_a_dir, "{bad}", "not a regular file"), id="export-raw-unreadable"),
    pytest.param(_export(_bad_prompt_line, "{bad}:3:"), id="export-prompts-bad-json-line-3"),
    pytest.param(_export(_duplicate_prompt, "{bad}:4:", "duplicate sample_id"), id="export-prompts-duplicate-id"),
    pytest.param(_export(_no_prompts, "{bad}", "not found"), id="export-prompts-missing"),
    pytest.param(_export(_nothing, "--to", ".txt", to="{root}/export.txt"), id="export-to-unknown-type"),
    pytest.param(_export(_nothing, "--to", "directory not found", to="{root}/absent/export.jsonl"),
                 id="export-to-missing-dir"),
    pytest.param(_export(_nothing, "--to", "run's own files", to="{run}/a/raw_responses.jsonl"),
                 id="export-to-over-the-records"),
    pytest.param(_export(_nothing, "--to", "run's own files", to="{run}/b/new.jsonl"),
                 id="export-to-inside-a-dataset"),
    pytest.param(_export(_nothing, "--drop", "'nosuch'", extra=("--only", "a", "--drop", "nosuch")),
                 id="export-drop-unknown"),
    pytest.param(_export(_nothing, "--model-profile", extra=("--only", "a", "--model-profile", "nope")),
                 id="export-model-profile-unknown"),
    pytest.param(_export(_nothing, "tokenizer", "dataset b", extra=()), id="export-text-without-tokenizer"),
    pytest.param(_export(_nothing, "--format", "'messages'", extra=("--only", "a", "--format", "conversations")),
                 id="export-conversations-of-ids"),
    # report (its parameter files and NAME)
    pytest.param(_report_case("absent", None, "absent.yaml", "file not found"), id="report-params-missing"),
    pytest.param(_report_case("run_dir: [\n", None, "params.yaml", "line 2"), id="report-params-bad-yaml"),
    pytest.param(_report_case("run_dir: {run}\ncolour: red\n", None, "colour", "unknown key"),
                 id="report-params-unknown-key"),
    pytest.param(_report_case("run_dir: {run}\nbins: many\n", None, "bins", "expected int"),
                 id="report-params-wrong-type"),
    pytest.param(_report_case("- run_dir\n", None, "expected a mapping"), id="report-params-wrong-yaml-type"),
    pytest.param(_report_case("run_dir: {run}\n", "../../etc/passwd", "NAME", "no such notebook file"),
                 id="report-name-traversal"),
    pytest.param(_report_case("run_dir: {run}\n", "token_distribution", "-p", "bins", extra=("-p", "bins=x")),
                 id="report-override-wrong-type"),
    pytest.param(_report_case("run_dir: {root}/no-such-run\n", "token_distribution", "no-such-run"),
                 id="report-run-dir-missing"),
    pytest.param(_report_case("run_dir: {run}\n", "token_distribution", "run.json", damage=_bad_run_json),
                 id="report-run-json-bad"),
    # demo and sim
    pytest.param(lambda env: (["demo", "--datasets", str(env.root / "absent.yaml"), "--out", str(env.root / "demo")],
                              ["absent.yaml", "file not found"]), id="demo-manifest-missing"),
    pytest.param(lambda env: (["demo", "--datasets", str(env.yaml("datasets: [")), "--out", str(env.root / "demo")],
                              ["params.yaml", "invalid YAML"]), id="demo-manifest-bad-yaml"),
    pytest.param(lambda env: (["demo", "--datasets", str(env.prompts_manifest(GOOD_IDS)[0]),
                               "--out", str(env.file("f.txt", "x"))], ["--out", "f.txt"]), id="demo-out-is-a-file"),
    pytest.param(lambda env: (["sim", "--port", env.servers["open"].rsplit(":", 1)[1]], ["--port", "in use"]),
                 id="sim-port-in-use"),
    pytest.param(lambda env: (["sim", "--port", "0", "--fault-error-rate", "0.7", "--fault-hang-rate", "0.7"],
                              ["fault rates"]), id="sim-fault-rates-over-one"),
]


@pytest.mark.integration
@pytest.mark.parametrize("build", CASES)
def test_bad_input_is_one_line_and_exit_2(env: Env, build: Build) -> None:
    args, needles = build(env)
    before = _snapshot(env.root)
    done = workbench(*args, env=NO_KEY_ENV)
    assert_one_line_error(done, *needles)
    assert _snapshot(env.root) == before, "a bad invocation changed or created files"


# --- a line of 100 MB -------------------------------------------------------------------------

# The child's own peak: VmHWM of /proc/self/status counts from the exec, where ru_maxrss also
# keeps the parent's resident memory at the fork (a big test process would be measured).
_MEASURED = """
import os, re, resource, sys
from workbench.cli import main
code = main(sys.argv[1:])
try:
    with open("/proc/self/status") as fh:
        peak = int(re.search(r"VmHWM:\\s*(\\d+) kB", fh.read()).group(1)) * 1024
except OSError:
    peak = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024
with open(os.environ["RSS_FILE"], "w") as fh:
    fh.write(str(peak))
sys.exit(code)
"""


def _measured(tmp: Path, *args: str) -> tuple[subprocess.CompletedProcess[str], int]:
    """`workbench ARGS` in a child that reports its peak resident memory in bytes."""
    rss_file = tmp / "rss.txt"
    done = subprocess.run([sys.executable, "-c", _MEASURED, *args], capture_output=True, text=True,
                          timeout=120, env={**os.environ, "RSS_FILE": str(rss_file)}, check=False)
    return done, int(rss_file.read_text())


def _write_big_line(path: Path, first: bytes, head: bytes, tail: bytes) -> None:
    """first, then one line of about 100 MB (head, token ids, tail), then first again."""
    with path.open("wb") as fh:
        fh.write(first)
        fh.write(head)
        chunk = b"7," * (1 << 20)
        for _ in range(BIG_LINE_BYTES // len(chunk)):
            fh.write(chunk)
        fh.write(b"7" + tail + b"\n")
        fh.write(first.replace(b'"sample_id": 1', b'"sample_id": 3'))


@pytest.mark.integration
def test_a_prompt_line_of_100_mb_is_refused_by_its_number(env: Env) -> None:
    big = env.root / "big.jsonl"
    _write_big_line(big, GOOD_IDS.encode(), b'{"sample_id": 2, "input_ids": [', b"]}")
    manifest = _manifest(env.root, [{"name": "a", "path": str(big), "input": "input_ids"}])
    before = _snapshot(env.run)
    done, rss = _measured(env.root, *env.generate(manifest))
    assert_one_line_error(done, f"{big}:2:", "longer than")
    assert rss < 400 << 20, f"peak memory {rss >> 20} MiB for a 100 MB line"
    assert _snapshot(env.run) == before


@pytest.mark.integration
def test_a_record_line_of_100_mb_is_read_within_bounds(env: Env) -> None:
    raw = env.run / "a" / "raw_responses.jsonl"
    first = raw.read_bytes().splitlines(keepends=True)[0]
    _write_big_line(raw, first, b'{"sample_id": 1000, "output_ids": [',
                    b'], "prompt_tokens": 3, "completion_tokens": 5, "finish_reason": "stop"}')
    done, rss = _measured(env.root, "stats", str(env.run))
    assert done.returncode == 0 and "Traceback" not in done.stderr, done.stderr
    assert rss < 600 << 20, f"stats: peak memory {rss >> 20} MiB for a 100 MB line"
    done, rss = _measured(env.root, "validate", str(env.run), "--workers", "1")
    assert done.returncode == 0 and "Traceback" not in done.stderr, done.stderr
    assert "raw_responses.jsonl:2:" in done.stdout
    assert rss < 1500 << 20, f"validate: peak memory {rss >> 20} MiB for a 100 MB line"


# --- findings that are not failures ------------------------------------------------------------


@pytest.mark.integration
def test_bad_record_lines_are_findings_named_by_line(env: Env) -> None:
    raw = env.run / "a" / "raw_responses.jsonl"
    lines = raw.read_bytes().splitlines(keepends=True)
    raw.write_bytes(b"".join(lines[:2] + [b'{"sample_id": oops\n', b"[1, 2]\n"] + lines[2:]))
    before = _snapshot(env.run)
    stats = workbench("stats", str(env.run))
    assert stats.returncode == 0 and "a: 2 unreadable lines" in stats.stdout, stats.stdout + stats.stderr
    validate = workbench("validate", str(env.run), "--strict")
    assert validate.returncode == 1 and "Traceback" not in validate.stderr
    assert "raw_responses.jsonl:3: JSON is malformed" in validate.stdout
    assert "raw_responses.jsonl:4:" in validate.stdout
    export = workbench("export", str(env.run), "--to", str(env.root / "x.jsonl"), "--only", "a")
    assert export.returncode == 0 and "parse_error 2" in export.stdout, export.stdout + export.stderr
    assert _snapshot(env.run) == before


@pytest.mark.integration
@pytest.mark.parametrize("role", ["unreachable", "html_502", "html_200", "not_sglang"])
def test_monitor_shows_a_bad_server_as_an_alert(env: Env, role: str) -> None:
    done = workbench("monitor", str(env.run), "--once", "--server", env.servers[role])
    assert done.returncode == 1 and "Traceback" not in done.stderr, done.stderr  # 1: it alerted
    alert = next(line for line in done.stdout.splitlines() if line.startswith("ALERT server"))
    assert env.servers[role] in alert


# --- property tests: arbitrary JSON lines never raise an unexpected exception ------------------

SCALARS = (
    st.none() | st.booleans() | st.integers(-(2**70), 2**70)
    | st.floats(allow_nan=False, allow_infinity=False) | st.text(max_size=5)
)
JSON = st.recursive(SCALARS, lambda inner: st.lists(inner, max_size=4)
                    | st.dictionaries(st.text(max_size=4), inner, max_size=4), max_leaves=12)
IDS = st.lists(st.integers(-(2**66), 2**66) | st.sampled_from([163606, 163607, 163586, 163585]), max_size=12)


def _maybe(valid: st.SearchStrategy[Any]) -> st.SearchStrategy[Any]:
    return valid | JSON


RECORD_LIKE = st.fixed_dictionaries({}, optional={
    "sample_id": _maybe(st.integers(0, 5) | st.text(max_size=3)),
    "output_ids": _maybe(IDS),
    "prompt_tokens": _maybe(st.integers(-3, 10**12)),
    "completion_tokens": _maybe(st.integers(-3, 10**12)),
    "cached_tokens": _maybe(st.integers(-3, 50)),
    "finish_reason": _maybe(st.sampled_from(["stop", "length", "abort", ""])
                            | st.fixed_dictionaries({"type": st.text(max_size=6)}, optional={"matched": JSON})),
    "matched_stop": JSON,
    "e2e_latency": _maybe(st.floats(allow_nan=True, allow_infinity=True)),
    "ts": _maybe(st.floats(-1e12, 1e12)),
    "meta_info": st.dictionaries(st.sampled_from(["prompt_tokens", "completion_tokens", "cached_tokens",
                                                  "finish_reason", "e2e_latency"]), JSON, max_size=4),
    "usage": st.dictionaries(st.sampled_from(["prompt_tokens", "completion_tokens", "prompt_tokens_details"]),
                             JSON, max_size=3),
    "schema": JSON,
})
LINE = RECORD_LIKE.map(lambda v: json.dumps(v).encode()) | JSON.map(lambda v: json.dumps(v).encode()) \
    | st.binary(max_size=30).map(lambda b: b.replace(b"\n", b""))


@settings(max_examples=300, deadline=None)
@given(lines=st.lists(LINE, max_size=6), profile=st.sampled_from(["kimi-k2.5", "qwen3", "plain"]))
def test_record_checks_accept_any_line(lines: list[bytes], profile: str) -> None:
    rows, _problems = parse_lines(b"\n".join(lines) + b"\n", with_output_ids=True)
    checker = RecordChecker(get_profile(profile))
    for found in checker.check_rows(rows):
        assert all(isinstance(rule, str) and isinstance(detail, str) for rule, detail in found)


def _plant_run(folder: Path, lines: list[bytes], prompt_ids: list[Any], torn: bytes) -> None:
    (folder / "a").mkdir(parents=True)
    (folder / "a" / "raw_responses.jsonl").write_bytes(b"".join(line + b"\n" for line in lines) + torn)
    prompts = b"".join(encode_line(PromptRecord(sid, [5, 6])) for sid in dict.fromkeys(prompt_ids))
    (folder / "a" / "prompts.jsonl").write_bytes(prompts)
    (folder / "run.json").write_text(json.dumps({"model_profile": "kimi-k2.5",
                                                 "datasets": {"a": {"input": "input_ids", "prompts": 3}}}))


@settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(lines=st.lists(LINE, max_size=6), prompt_ids=st.lists(st.integers(0, 5) | st.text(max_size=2), max_size=4),
       torn=st.sampled_from([b"", b'{"sample_id": 9, "output_ids": [1,']))
def test_validate_stats_and_export_accept_any_lines(lines: list[bytes], prompt_ids: list[Any], torn: bytes) -> None:
    with tempfile.TemporaryDirectory() as tmp:
        run = Path(tmp) / "run"
        _plant_run(run, lines, prompt_ids, torn)
        report = validate_run(run, workers=1)
        assert isinstance(format_report(report), str)
        json.dumps(report.to_builtins())
        stats = collect_stats(run)
        assert isinstance(format_stats_table(stats), str)
        json.dumps(stats.to_dict())
        try:
            export_run(run, Path(tmp) / "x.jsonl", ExportOptions())
        except WorkbenchError:
            pass
