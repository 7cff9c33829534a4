"""A new user's first mistakes, each answered on one line with exit 2 and a hint: usage
errors, a server URL with /v1 or no scheme (fixed, with a notice), a URL that is not the
server's root (404 on the info paths)."""

from __future__ import annotations

from pathlib import Path

import pytest
from conftest import EXAMPLES, workbench, write_manifest

from workbench.server.client import server_base_url
from workbench.server.launch import ServerProcess


def one_line_error(done: object) -> str:
    lines = done.stderr.strip().splitlines()  # type: ignore[attr-defined]
    assert done.returncode == 2, done.stderr  # type: ignore[attr-defined]
    assert len(lines) == 1 and lines[0].startswith("workbench: error: "), lines
    return lines[0]


@pytest.mark.parametrize(("typed", "url", "notes"), [
    ("http://h:30000", "http://h:30000", 0),
    ("http://h:30000/", "http://h:30000", 0),
    ("http://h:30000/v1", "http://h:30000", 1),
    ("http://h:30000/v1/", "http://h:30000", 1),
    ("http://h:30000/generate", "http://h:30000", 1),
    ("h:30000", "http://h:30000", 1),
    ("127.0.0.1:30000/v1", "http://127.0.0.1:30000", 2),
    ("https://gw.example/sglang/v1", "https://gw.example/sglang", 1),
])
def test_server_url_is_made_the_servers_root(typed: str, url: str, notes: int) -> None:
    fixed, notices = server_base_url(typed)
    assert fixed == url and len(notices) == notes


def test_usage_errors_are_one_line_naming_the_help() -> None:
    assert one_line_error(workbench("generate", "--datasets", "x.yaml")) == (
        "workbench: error: the following arguments are required: --out "
        "(see: workbench generate --help)")
    assert one_line_error(workbench("generate", "--datasets", "x.yaml", "--out", "o")) == (
        "workbench: error: one of the arguments --server --launch is required "
        "(see: workbench generate --help)")
    assert "invalid choice: 'reprot'" in one_line_error(workbench("reprot"))
    bad = one_line_error(workbench("generate", "--datasets", "x.yaml", "--server", "s", "--out", "o",
                                   "--concurrency", "zero"))
    assert "expected a whole number, got 'zero', or auto" in bad


@pytest.fixture
def manifest(tmp_path: Path) -> Path:
    return write_manifest(tmp_path, [{"name": "p", "path": str(EXAMPLES / "data" / "pretokenized.jsonl"),
                                      "input": "input_ids", "max_samples": 3}])


@pytest.mark.integration
def test_server_url_fixes_are_noted_and_the_run_works(
    shared_sim: ServerProcess, manifest: Path, tmp_path: Path
) -> None:
    sim = shared_sim
    port = sim.url.rsplit(":", 1)[1]
    done = workbench("generate", "--datasets", str(manifest), "--server", f"127.0.0.1:{port}/v1",
                     "--out", str(tmp_path / "out"))
    assert done.returncode == 0, done.stderr
    notes = [line for line in done.stderr.splitlines() if line.startswith("workbench: note: ")]
    assert notes == [
        f"workbench: note: no scheme in '127.0.0.1:{port}/v1': using http://127.0.0.1:{port}/v1",
        (f"workbench: note: dropped /v1 from the server URL: using http://127.0.0.1:{port} "
         "(the workbench talks to SGLang's native API at the server's root)"),
    ]
    assert (tmp_path / "out" / "p" / "raw_responses.jsonl").read_text().count("\n") == 3


@pytest.mark.integration
def test_a_url_below_the_root_gets_the_root_as_hint(
    shared_sim: ServerProcess, manifest: Path, tmp_path: Path
) -> None:
    sim = shared_sim
    done = workbench("generate", "--datasets", str(manifest), "--server", f"{sim.url}/api",
                     "--out", str(tmp_path / "out"))
    line = one_line_error(done)
    assert line.endswith(f"(no SGLang server at {sim.url}/api: the URL should probably be {sim.url})")
    assert not (tmp_path / "out").exists()


def test_tuning_parameter_checks_name_the_yaml_line(tmp_path: Path) -> None:
    params = tmp_path / "tuning.yaml"
    params.write_text("server:\n  launcher: sim\ngrid:\n  baseline: nope\n  configs:\n"
                      "    - name: a\n      args: {mem_fraction_static: 0.8}\nload:\n  concurrency: [4]\n  duration: 5\n")
    line = one_line_error(workbench("tune", "--params", str(params), "--dry-run"))
    assert line.startswith(f"workbench: error: {params}:4: grid.baseline: no configuration 'nope'"), line
