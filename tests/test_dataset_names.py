"""Dataset names that a run directory's own entries take are refused before a run starts,
naming the key and its YAML line (a dataset folder `run.json` would collide with the run's
manifest)."""

from __future__ import annotations

import asyncio
from pathlib import Path

import httpx
import pytest
from conftest import workbench

from workbench.config import load_manifest
from workbench.errors import ConfigError
from workbench.report import lab
from workbench.rundir import layout
from workbench.server.client import SGLangClient
from workbench.server.launch import find_free_port


def manifest(tmp_path: Path, second: str) -> Path:
    (tmp_path / "a.jsonl").write_text('{"sample_id": 1, "text": "a"}\n')
    path = tmp_path / "datasets.yaml"
    path.write_text(
        "model_profile: kimi-k2.5\n"
        "datasets:\n"
        "  - name: first\n"
        "    path: a.jsonl\n"
        "    input: text\n"
        "  - path: a.jsonl\n"
        "    input: text\n"
        f"    name: {second}\n")
    return path


def refused(path: Path, out: Path) -> str:
    """The ConfigError of a generation into out; no request reaches the server."""
    from workbench.generate.session import run_generation

    def no_server(request: httpx.Request) -> httpx.Response:
        raise AssertionError(f"the server was asked: {request.url}")

    async def go() -> None:
        transport = httpx.MockTransport(no_server)
        async with SGLangClient("http://gpu:30000", transport=transport) as client:
            await run_generation(load_manifest(path), client, out)

    with pytest.raises(ConfigError) as caught:
        asyncio.run(go())
    assert not out.exists()
    return str(caught.value)


@pytest.mark.parametrize(("name", "taken"), [
    ("run.json", "run.json"), ("Run.JSON", "run.json"), ("explore.ipynb", "explore.ipynb"),
    ("reports", "reports"), ("raw_responses.jsonl", "raw_responses.jsonl"), ("sim.log", "sim.log"),
])
def test_a_name_a_run_directory_entry_takes_is_refused(tmp_path: Path, name: str,
                                                       taken: str) -> None:
    path = manifest(tmp_path, name)
    message = refused(path, tmp_path / "out")
    assert message.startswith(f"{path}:8: datasets[1].name: {name!r} would collide with the run "
                              f"directory's own {taken!r} (reserved: run.json, "), message
    assert "\n" not in message


def test_the_command_says_it_in_one_line_before_asking_the_server(tmp_path: Path) -> None:
    path = manifest(tmp_path, "run.json")
    server = f"http://127.0.0.1:{find_free_port()}"
    done = workbench("generate", "--datasets", str(path), "--server", server,
                     "--out", str(tmp_path / "out"))
    assert done.returncode == 2 and "Traceback" not in done.stderr
    expected = (f"workbench: error: {path}:8: datasets[1].name: 'run.json' would collide with "
                f"the run directory's own 'run.json' (reserved: {', '.join(layout.RUN_ENTRIES)})")
    assert done.stderr.splitlines() == [expected]


def test_the_reserved_names_cover_what_the_verbs_write_at_a_run_top() -> None:
    written = {layout.MANIFEST_FILE, layout.LOCK_FILE, *layout.DATASET_FILES, lab.NOTEBOOK, lab.LOG}
    assert written <= set(layout.RUN_ENTRIES)


def test_names_that_only_look_alike_are_kept(tmp_path: Path) -> None:
    for name in ("run.jsonl", "run_json", "report", "exports"):
        layout.check_dataset_names(load_manifest(manifest(tmp_path, name)))
