"""Hardening of the parameter files: YAML aliases that expand a small file into a huge one
("billion laughs") are refused before anything is built, in every parameter file and `-p`
value; dataset names the run directory itself writes (server.log, ...) are refused, without case,
naming the key and its line."""

from __future__ import annotations

from pathlib import Path

import pytest
import yaml
from conftest import ROOT

from workbench.config import load_manifest, load_yaml_params
from workbench.errors import ConfigError
from workbench.report.parameters import load_parameters, parse_overrides
from workbench.rundir import layout

LEVELS = "bcdefg"


def laughs(first_key: str = "a") -> str:
    """Seven levels of ten aliases each: 10^7 strings once expanded."""
    lines = [f'{first_key}: &a ["x","x","x","x","x","x","x","x","x","x"]']
    previous = "a"
    for name in LEVELS:
        lines.append(f"{name}: &{name} [" + ",".join([f"*{previous}"] * 10) + "]")
        previous = name
    return "\n".join(lines) + "\n"


def refused_quickly(load: object, *args: object) -> str:
    """The one-line refusal of `load(*args)`, given before anything is built from the file
    (expanded, the document took 35 s and 840 MB): building a document fails this test."""
    def built(*_: object, **__: object) -> None:
        raise AssertionError("the document was built before its aliases were counted")

    with pytest.MonkeyPatch.context() as patch:
        patch.setattr(yaml.constructor.BaseConstructor, "construct_document", built)
        with pytest.raises(ConfigError) as caught:
            load(*args)  # type: ignore[operator]
    assert "\n" not in str(caught.value)
    return str(caught.value)


def test_a_billion_laughs_parameter_file_is_refused_before_it_is_built(tmp_path: Path) -> None:
    path = tmp_path / "laughs.yaml"
    path.write_text(laughs())
    message = refused_quickly(load_yaml_params, path, dict)
    assert message == (f"{path}:2: YAML aliases (*a) expand past 100000 values: parameter "
                       "files accept only small aliases")


def test_a_billion_laughs_manifest_is_refused(tmp_path: Path) -> None:
    path = tmp_path / "datasets.yaml"
    path.write_text("model_profile: kimi-k2.5\n" + laughs("datasets"))
    assert refused_quickly(load_manifest, path).startswith(f"{path}:3: YAML aliases (*a) ")


def test_a_billion_laughs_report_parameter_file_and_override_are_refused(tmp_path: Path) -> None:
    path = tmp_path / "p.yaml"
    path.write_text(laughs("compare_run_dir"))
    notebook = ROOT / "notebooks" / "explore.ipynb"
    assert refused_quickly(load_parameters, notebook, path).startswith(f"{path}:2: YAML aliases")
    value = "[&a [x,x,x,x,x,x,x,x,x,x], " + ", ".join(
        f"&{n} [" + ",".join([f"*{p}"] * 10) + "]" for p, n in zip("a" + LEVELS, LEVELS)) + "]"
    message = refused_quickly(parse_overrides, [f"decontaminate={value}"])
    assert message.startswith("-p: decontaminate: YAML aliases (*a) expand past")


def test_a_small_alias_and_a_normal_manifest_still_load(tmp_path: Path) -> None:
    path = tmp_path / "s.yaml"
    path.write_text("base: &b {temperature: 0.5}\nsampling:\n  <<: *b\nother: *b\n")
    assert load_yaml_params(path, dict)["other"] == {"temperature": 0.5}
    (tmp_path / "a.jsonl").write_text('{"sample_id": 1, "text": "a"}\n')
    manifest = tmp_path / "datasets.yaml"
    manifest.write_text("model_profile: kimi-k2.5\ndatasets:\n  - {name: a, path: a.jsonl, "
                        "input: text}\n")
    assert [ds.name for ds in load_manifest(manifest).datasets] == ["a"]


def _manifest(tmp_path: Path, name: str) -> Path:
    (tmp_path / "a.jsonl").write_text('{"sample_id": 1, "text": "a"}\n')
    path = tmp_path / "datasets.yaml"
    path.write_text("model_profile: kimi-k2.5\ndatasets:\n  - path: a.jsonl\n    input: text\n"
                    f"    name: {name}\n")
    return path


@pytest.mark.parametrize(("name", "taken"), [
    ("server.log", "server.log"), ("Server.LOG", "server.log"), ("scores.jsonl", "scores.jsonl"),
    ("skipped.jsonl", "skipped.jsonl"), ("TUNING", "tuning"),
])
def test_a_name_the_run_writes_itself_is_refused(tmp_path: Path, name: str, taken: str) -> None:
    path = _manifest(tmp_path, name)
    with pytest.raises(ConfigError) as caught:
        layout.check_dataset_names(load_manifest(path))
    assert str(caught.value).startswith(
        f"{path}:5: datasets[0].name: {name!r} would collide with the run directory's own "
        f"{taken!r} (reserved: ")


def test_the_reserved_names_include_the_launched_server_s_log() -> None:
    from workbench.generate import launched

    assert launched.SERVER_LOG in layout.RUN_ENTRIES


def test_a_reserved_name_is_refused_before_a_server_is_launched(tmp_path: Path) -> None:
    from conftest import workbench, write_manifest

    (tmp_path / "ids.jsonl").write_text('{"sample_id": 0, "input_ids": [1, 2]}\n')
    manifest = write_manifest(tmp_path, [{"name": "Server.log", "path": "ids.jsonl",
                                          "input": "input_ids"}])
    server = tmp_path / "server.yaml"
    server.write_text("command: [/bin/sh, -c, 'touch started; sleep 60']\n")
    refused = workbench("generate", "--datasets", str(manifest), "--launch", str(server),
                        "--out", str(tmp_path / "out"), cwd=tmp_path)
    assert refused.returncode == 2, refused.stderr
    assert "datasets[0].name" in refused.stderr and "server.log" in refused.stderr
    assert not (tmp_path / "started").exists() and not (tmp_path / "out").exists()
