"""Parameter files: typed loading, one-line errors naming file and key path, manifest checks."""

from __future__ import annotations

import copy
import re
from pathlib import Path
from typing import Any

import msgspec
import pytest
import yaml
from conftest import ROOT

from workbench.config import (
    DatasetSpec,
    Manifest,
    Sampling,
    SamplingOverride,
    load_manifest,
    load_yaml_params,
)
from workbench.errors import ConfigError, InputError

BASE: dict[str, Any] = {
    "model_profile": "kimi-k2.5",
    "tokenizer": "../tok",
    "sampling": {"temperature": 0.6, "top_p": 0.95, "top_k": 20, "max_new_tokens": 512},
    "datasets": [
        {"name": "a", "path": "../data/a.jsonl", "input": "input_ids"},
        {
            "name": "b",
            "path": "../data/b.jsonl",
            "input": "messages",
            "chat_template_kwargs": {"thinking": True},
            "sampling": {"temperature": 1.0},
        },
    ],
}


@pytest.fixture
def workdir(tmp_path: Path) -> Path:
    """tmp/params (manifests), tmp/data/{a,b}.jsonl, tmp/tok (a tokenizer directory)."""
    (tmp_path / "params").mkdir()
    (tmp_path / "data").mkdir()
    (tmp_path / "tok").mkdir()
    for name in ("a", "b"):
        (tmp_path / "data" / f"{name}.jsonl").write_text("")
    return tmp_path


def write_manifest(workdir: Path, data: Any, name: str = "m.yaml") -> Path:
    path = workdir / "params" / name
    path.write_text(yaml.safe_dump(data, sort_keys=False))
    return path


def manifest_error(path: Path) -> str:
    with pytest.raises(ConfigError) as info:
        load_manifest(path)
    return str(info.value)


def without_line(message: str) -> str:
    """The message without the YAML line after the file name (tested on its own)."""
    return re.sub(r"^(.*?\.yaml):\d+: ", r"\1: ", message)


def changed(edit: Any) -> dict[str, Any]:
    """A deep copy of BASE with `edit(copy)` applied."""
    data = copy.deepcopy(BASE)
    edit(data)
    return data


# ------------------------------------------------------------------------------ good files


def test_good_manifest_resolves_paths_and_inherits(workdir: Path) -> None:
    path = write_manifest(workdir, BASE)
    manifest = load_manifest(path)
    assert manifest.source == str(path)
    assert manifest.model_profile == "kimi-k2.5"
    assert manifest.sampling == Sampling(temperature=0.6, top_p=0.95, top_k=20, max_new_tokens=512)
    assert manifest.tokenizer == str((workdir / "tok").resolve())
    a, b = manifest.datasets
    assert a.path == str((workdir / "data" / "a.jsonl").resolve())
    assert a.tokenizer == manifest.tokenizer  # the manifest's tokenizer is inherited
    assert (a.id_field, a.max_samples, a.max_tokens, a.chat_template_kwargs) == (
        "sample_id",
        None,
        None,
        {},
    )
    assert b.chat_template_kwargs == {"thinking": True}
    assert b.sampling == SamplingOverride(temperature=1.0)


def test_sampling_for_merges_dataset_overrides(workdir: Path) -> None:
    manifest = load_manifest(write_manifest(workdir, BASE))
    assert manifest.sampling_for(manifest.dataset("a")) is manifest.sampling
    merged = manifest.sampling_for(manifest.dataset("b"))
    assert merged == Sampling(temperature=1.0, top_p=0.95, top_k=20, max_new_tokens=512)
    assert manifest.sampling.temperature == 0.6  # unchanged


def test_sampling_to_sglang_sends_every_key() -> None:
    assert Sampling().to_sglang() == {
        "temperature": 1.0,
        "top_p": 1.0,
        "top_k": -1,
        "max_new_tokens": 2048,
    }


def test_defaults_absolute_paths_and_dataset_tokenizer(workdir: Path) -> None:
    data = {
        "model_profile": "qwen3",
        "trust_remote_code": True,
        "datasets": [
            {
                "name": "x.1-y_z",
                "path": str(workdir / "data" / "a.jsonl"),
                "input": "messages",
                "tokenizer": "../tok",
            },
        ],
    }
    manifest = load_manifest(write_manifest(workdir, data))
    assert manifest.sampling == Sampling()
    assert manifest.tokenizer is None
    (ds,) = manifest.datasets
    assert ds.path == str(workdir / "data" / "a.jsonl")
    assert ds.tokenizer == str((workdir / "tok").resolve())
    assert ds.trust_remote_code is True  # the manifest's switch reaches every dataset


def test_home_is_expanded(workdir: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("HOME", str(workdir))
    manifest = load_manifest(
        write_manifest(workdir, changed(lambda d: d.update(tokenizer="~/tok")))
    )
    assert manifest.tokenizer == str((workdir / "tok").resolve())


def test_demo_manifest_loads() -> None:
    manifest = load_manifest(ROOT / "params" / "datasets.demo.yaml")
    assert [ds.name for ds in manifest.datasets] == ["B1_glaive", "B2_code", "B3_pretok",
                                                     "B4_tool_turns"]
    glaive, code, pretok, tool_turns = manifest.datasets
    assert (tool_turns.turns, tool_turns.input, tool_turns.render) == ("each", "messages",
                                                                       "tokenizer")
    assert glaive.chat_template_kwargs == {"thinking": True}
    assert code.max_tokens == 20000
    assert manifest.sampling_for(code).max_new_tokens == 2048
    assert pretok.input == "input_ids" and pretok.max_samples == 200
    assert all(Path(ds.path).is_file() for ds in manifest.datasets)


def test_kimi_manifest_is_valid_once_its_paths_exist(workdir: Path) -> None:
    text = (ROOT / "params" / "datasets.kimi-k25.yaml").read_text()
    for absolute in sorted(set(re.findall(r"(/data/eagle3/prompts/\S+)", text))):
        (workdir / "data" / Path(absolute).name).write_text("")
    (workdir / "data" / "requests-sample.jsonl").write_text(
        '{"chat_template_kwargs": {"thinking": true}}\n' * 3 + '{"chat_template_kwargs": {"thinking": false}}\n')
    text = text.replace("/data/eagle3/prompts/", "../data/").replace("/models/Kimi-K2.5", "../tok")
    text = text.replace("/data/eagle3/deployment/", "../data/")
    manifest = load_manifest(write_manifest(workdir, yaml.safe_load(text)))
    assert manifest.model_profile == "kimi-k2.5"
    assert all(ds.trust_remote_code for ds in manifest.datasets)
    assert manifest.dataset("B2_code").id_field == "id"
    turns = manifest.dataset("B4_tool_turns")
    assert [(m.name, m.weight) for m in turns.mode_list()] == [("thinking=true", 3.0),
                                                               ("thinking=false", 1.0)]


def test_dataset_lookup_names_known_datasets(workdir: Path) -> None:
    manifest = load_manifest(write_manifest(workdir, BASE))
    with pytest.raises(ConfigError) as info:
        manifest.dataset("zzz")
    assert str(info.value) == f"{manifest.source}: datasets: no dataset named 'zzz' (known: a, b)"


# ------------------------------------------------------------------ bad keys, types, values

BAD_VALUES = [
    (
        lambda d: d["datasets"][0].update(max_samples="3"),
        "datasets[0].max_samples: expected int, got str",
    ),
    (
        lambda d: d["datasets"][0].update(max_samples=True),
        "datasets[0].max_samples: expected int, got bool",
    ),
    (
        lambda d: d["datasets"][0].update(max_samples=0),
        "datasets[0].max_samples: expected int >= 1, got 0",
    ),
    (
        lambda d: d["datasets"][1].update(max_tokens=-5),
        "datasets[1].max_tokens: expected int >= 1, got -5",
    ),
    (
        lambda d: d["sampling"].update(temperature=-0.5),
        "sampling.temperature: expected float >= 0.0, got -0.5",
    ),
    (lambda d: d["sampling"].update(top_p=1.5), "sampling.top_p: expected float <= 1.0, got 1.5"),
    (lambda d: d["sampling"].update(top_p=0), "sampling.top_p: expected float > 0.0, got 0"),
    (
        lambda d: d["sampling"].update(top_k=0),
        "sampling.top_k: expected -1 (off) or an int >= 1, got 0",
    ),
    (
        lambda d: d["sampling"].update(top_k=-2),
        "sampling.top_k: expected -1 (off) or an int >= 1, got -2",
    ),
    (
        lambda d: d["sampling"].update(max_new_tokens=0),
        "sampling.max_new_tokens: expected int >= 1, got 0",
    ),
    (
        lambda d: d["sampling"].update(max_new_tokens=1.5),
        "sampling.max_new_tokens: expected int, got float",
    ),
    (
        lambda d: d["datasets"][1]["sampling"].update(temperature="hot"),
        "datasets[1].sampling.temperature: expected float, got str",
    ),
    (
        lambda d: d["datasets"][1]["sampling"].update(top_k=0),
        "datasets[1].sampling.top_k: expected -1 (off) or an int >= 1, got 0",
    ),
    (
        lambda d: d["datasets"][0].update(input="tokens"),
        "datasets[0].input: invalid value 'tokens' (expected one of: conversations, input_ids, messages, text)",
    ),
    (lambda d: d["datasets"][0].pop("path"), "datasets[0].path: missing required key"),
    (lambda d: d.pop("model_profile"), "model_profile: missing required key"),
    (
        lambda d: d["sampling"].update(topp=0.9),
        "sampling.topp: unknown key (known: max_new_tokens, temperature, top_k, top_p)",
    ),
    (
        lambda d: d["datasets"][1]["sampling"].update(seed=1),
        "datasets[1].sampling.seed: unknown key (known: max_new_tokens, temperature, top_k, top_p)",
    ),
    (
        lambda d: d.update(dataset=[]),
        "dataset: unknown key "
        "(known: concurrency, datasets, dedup, dedup_threshold, model_profile, modes, order, sampling, "
        "tokenizer, trust_remote_code, turns)",
    ),
    (
        lambda d: d["datasets"][0].update(max_sample=3),
        "datasets[0].max_sample: unknown key (known: chat_template_kwargs, context_fit, "
        "context_fit_min_tokens, dedup, id_field, input, max_samples, max_tokens, modes, name, order, "
        "path, render, sampling, tokenizer, tools_field, truncated, trust_remote_code, turns)",
    ),
    (lambda d: d.update(datasets={"name": "a"}), "datasets: expected list, got mapping"),
    (lambda d: d.update(sampling=[1]), "sampling: expected mapping, got list"),
    (
        lambda d: d["datasets"][1].update(chat_template_kwargs=["thinking"]),
        "datasets[1].chat_template_kwargs: expected mapping, got list",
    ),
    (
        lambda d: d.update(model_profile="llama"),
        "model_profile: unknown model profile 'llama' (known: kimi-k2.5, plain, qwen3)",
    ),
    (lambda d: d.update(datasets=[]), "datasets: at least one dataset is needed"),
    (lambda d: d.update({1: 2}), "key 1 must be a string"),
    (
        lambda d: d["datasets"][1].update(chat_template_kwargs={1: True}),
        "datasets[1].chat_template_kwargs: key 1 must be a string",
    ),
    (
        lambda d: d["datasets"][1].update(name="a"),
        "datasets[1].name: duplicate name 'a' (also datasets[0])",
    ),
    (
        lambda d: d["datasets"][0].update(chat_template_kwargs={"thinking": True}),
        "datasets[0].chat_template_kwargs: only applies to input 'messages' or 'conversations'",
    ),
    (
        lambda d: d.pop("tokenizer"),
        "datasets[1].tokenizer: "
        "input 'messages' needs a tokenizer (set it here or at the top level)",
    ),
]


@pytest.mark.parametrize(("edit", "expected"), BAD_VALUES, ids=[e for _, e in BAD_VALUES])
def test_bad_value_names_file_and_key(workdir: Path, edit: Any, expected: str) -> None:
    path = write_manifest(workdir, changed(edit))
    message = manifest_error(path)
    assert re.fullmatch(rf"{re.escape(str(path))}(:\d+)?: {re.escape(expected)}", message), message


def test_errors_name_the_yaml_line(workdir: Path) -> None:
    text = (
        "model_profile: kimi-k2.5\n"
        "tokenizer: ../tok\n"
        "sampling:\n"
        "  temperature: 1.0\n"
        "  topp: 0.9\n"
        "datasets:\n"
        "  - name: a\n"
        "    path: ../data/a.jsonl\n"
        "    input: text\n"
        "  - name: b\n"
        "    path: ../data/b.jsonl\n"
        "    input: messages\n"
        "    max_samples: many\n"
    )
    path = workdir / "params" / "lines.yaml"
    path.write_text(text)
    assert manifest_error(path) == (
        f"{path}:5: sampling.topp: unknown key (known: max_new_tokens, temperature, top_k, top_p)")
    path.write_text(text.replace("  topp: 0.9\n", ""))
    assert manifest_error(path) == f"{path}:12: datasets[1].max_samples: expected int, got str"
    path.write_text(text.replace("  topp: 0.9\n", "").replace("many", "3").replace("b.jsonl", "c.jsonl"))
    assert manifest_error(path).startswith(f"{path}:10: datasets[1].path: file not found: ")
    path.write_text(text.replace("  topp: 0.9\n", "").replace("many", "3").replace("    input: text\n", ""))
    assert manifest_error(path) == f"{path}:6: datasets[0].input: missing required key"


@pytest.mark.parametrize("name", ["../x", "a/b", "", ".hidden", "-x", "a b", "a\n", "x" * 129, "é"])
def test_unsafe_dataset_names(workdir: Path, name: str) -> None:
    path = write_manifest(workdir, changed(lambda d: d["datasets"][1].update(name=name)))
    assert without_line(manifest_error(path)) == (
        f"{path}: datasets[1].name: {name!r} is not a safe directory name (letters, digits, "
        "'.', '_' and '-', starting with a letter or digit, at most 128 characters)"
    )


def test_missing_prompt_file_names_key_and_resolved_path(workdir: Path) -> None:
    path = write_manifest(
        workdir, changed(lambda d: d["datasets"][1].update(path="../data/nope.jsonl"))
    )
    resolved = (workdir / "data" / "nope.jsonl").resolve()
    assert without_line(manifest_error(path)) == f"{path}: datasets[1].path: file not found: {resolved}"


def test_missing_tokenizer_directory(workdir: Path) -> None:
    path = write_manifest(workdir, changed(lambda d: d["datasets"][0].update(tokenizer="../tok2")))
    resolved = (workdir / "tok2").resolve()
    assert without_line(manifest_error(path)) == f"{path}: datasets[0].tokenizer: directory not found: {resolved}"


def test_error_carries_key_and_source(workdir: Path) -> None:
    path = write_manifest(workdir, changed(lambda d: d["datasets"][0].update(max_samples="3")))
    with pytest.raises(InputError) as info:
        load_manifest(path)
    assert isinstance(info.value, ConfigError)
    assert (info.value.key, info.value.source) == ("datasets[0].max_samples", str(path))


# ------------------------------------------------------------------------------ YAML level

YAML_ERRORS = [
    (
        "model_profile: kimi-k2.5\nsampling:\n  temperature: [1\n",
        "invalid YAML at line 4, column 1: expected ',' or ']', but got '<stream end>'",
    ),
    ("a: 1\n b: 2\n", "invalid YAML at line 2, column 3: mapping values are not allowed here"),
    (
        "model_profile: x\nsampling: {}\nsampling: {}\n",
        "invalid YAML at line 3, column 1: duplicate key 'sampling'",
    ),
    ("", "empty file: expected a mapping of keys"),
    ("# nothing but a comment\n", "empty file: expected a mapping of keys"),
    ("- 1\n- 2\n", "expected a mapping of keys, got a list"),
    ("just text\n", "expected a mapping of keys, got a string"),
]


@pytest.mark.parametrize(("text", "expected"), YAML_ERRORS, ids=[e for _, e in YAML_ERRORS])
def test_yaml_level_errors_name_the_file(tmp_path: Path, text: str, expected: str) -> None:
    path = tmp_path / "p.yaml"
    path.write_text(text)
    assert without_line(manifest_error(path)) == f"{path}: {expected}"


def test_missing_file(tmp_path: Path) -> None:
    assert manifest_error(tmp_path / "none.yaml") == f"{tmp_path / 'none.yaml'}: file not found"


def test_merge_keys_may_override_without_duplicate_error(tmp_path: Path) -> None:
    path = tmp_path / "s.yaml"
    path.write_text(
        "base: &b {temperature: 0.5, top_p: 0.9}\nsampling:\n  <<: *b\n  temperature: 0.7\n"
    )

    class WithSampling(msgspec.Struct):
        base: dict[str, float]
        sampling: Sampling

    loaded = load_yaml_params(path, WithSampling)
    assert loaded.sampling == Sampling(temperature=0.7, top_p=0.9)


def load_error(path: Path, struct: Any) -> ConfigError:
    with pytest.raises(ConfigError) as info:
        load_yaml_params(path, struct)
    return info.value


def test_load_yaml_params_is_generic_and_takes_a_source_name(tmp_path: Path) -> None:
    path = tmp_path / "sampling.yaml"
    path.write_text("temperature: 1\nmax_new_tokens: 64\n")
    assert load_yaml_params(path, Sampling) == Sampling(temperature=1.0, max_new_tokens=64)
    path.write_text("temperature: warm\n")
    with pytest.raises(ConfigError) as info:
        load_yaml_params(path, Sampling, source="sampling params")
    assert str(info.value) == "sampling params: temperature: expected float, got str"
    assert str(load_error(path, Sampling)) == f"{path}:1: temperature: expected float, got str"


def test_spec_structs_keep_the_contract_shape() -> None:
    spec = DatasetSpec(name="d", path="/x.jsonl", input="text")
    assert spec.chat_template_kwargs == {} and spec.tokenizer is None and spec.sampling is None
    manifest = Manifest(
        source="m.yaml", model_profile="plain", sampling=Sampling(), datasets=[spec], tokenizer=None
    )
    assert manifest.sampling_for(spec) == Sampling()
