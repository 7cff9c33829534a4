"""Modes mixed within a dataset: the draw, the deployment sample, the manifest's `modes`."""

from __future__ import annotations

import json
import random
from pathlib import Path

import pytest

from workbench.config import load_manifest
from workbench.errors import ConfigError, DataError
from workbench.modes import deployment_mix, draw, mode_name, shares


def worst_gap(order: list[int], picks: dict[int, int], weights: list[float]) -> float:
    """The largest gap, over every prefix of `order` and every mode, between the prefix's
    count of the mode and its share of the prefix."""
    share = shares(weights)
    counts = [0] * len(weights)
    worst = 0.0
    for position, key in enumerate(order, start=1):
        counts[picks[key]] += 1
        worst = max(worst, *(abs(c - s * position) for c, s in zip(counts, share, strict=True)))
    return worst


@pytest.mark.parametrize("case", range(60))
def test_every_prefix_of_the_send_order_is_within_one_of_the_weights(case: int) -> None:
    rng = random.Random(case)
    weights = [rng.choice([0.05, 0.25, 0.5, 0.75, 1.0, 3.0, rng.random() + 0.01])
               for _ in range(rng.randint(2, 6))]
    order = list(range(rng.randint(1, 500)))
    rng.shuffle(order)
    picks = draw(order, weights, f"seed-{case}")
    assert worst_gap(order, picks, weights) < 1
    totals = [sum(1 for m in picks.values() if m == i) for i in range(len(weights))]
    exact = [s * len(order) for s in shares(weights)]
    assert all(abs(t - e) < 1 for t, e in zip(totals, exact, strict=True))  # largest remainder


def test_the_draw_is_the_seeds() -> None:
    order = list(range(400))
    first = draw(order, [0.5, 0.5], "7/data/modes")
    assert draw(order, [0.5, 0.5], "7/data/modes") == first
    assert draw(order, [0.5, 0.5], "8/data/modes") != first  # ties broken by the seed


def test_modes_chosen_before_are_kept_and_the_rest_make_up_the_mix() -> None:
    order = list(range(100))
    fixed = dict.fromkeys(range(20), 1)  # an earlier session sent the first 20 in mode 1
    picks = draw(order, [0.75, 0.25], "s", fixed)
    assert all(picks[k] == 1 for k in range(20))
    assert sum(1 for m in picks.values() if m == 1) == 25  # none more of mode 1 until it is due


def test_one_mode_takes_every_prompt() -> None:
    assert set(draw(list(range(10)), [2.0], "s").values()) == {0}


def test_a_deployment_sample_gives_each_argument_combination_its_share(tmp_path: Path) -> None:
    path = tmp_path / "requests.jsonl"
    bodies = ([{"messages": [], "chat_template_kwargs": {"thinking": True}}] * 6
              + [{"messages": [], "chat_template_kwargs": {"thinking": False}}] * 3
              + [{"messages": [], "reasoning_effort": "low"}])
    path.write_text("".join(json.dumps(b) + "\n" for b in bodies) + "\n")
    mix = deployment_mix(path, "requests.jsonl")
    assert [(m.name, m.chat_template_kwargs, m.count) for m in mix] == [
        ("thinking=true", {"thinking": True}, 6), ("thinking=false", {"thinking": False}, 3),
        ("reasoning_effort=low", {"reasoning_effort": "low"}, 1)]
    assert mode_name({}) == "default"


def test_a_bad_line_of_the_deployment_sample_is_named(tmp_path: Path) -> None:
    path = tmp_path / "requests.jsonl"
    path.write_text('{"messages": []}\n{oops\n')
    with pytest.raises(DataError, match=r"requests\.jsonl:2: invalid JSON"):
        deployment_mix(path, str(path))
    path.write_text('{"chat_template_kwargs": [1]}\n')
    with pytest.raises(DataError, match=r"requests\.jsonl:1: chat_template_kwargs: expected an object"):
        deployment_mix(path, str(path))


# --- the manifest's modes ---------------------------------------------------------------


def manifest(tmp_path: Path, body: str) -> Path:
    (tmp_path / "chat.jsonl").write_text(
        json.dumps({"sample_id": 0, "messages": [{"role": "user", "content": "hi"}]}) + "\n")
    (tmp_path / "ids.jsonl").write_text(json.dumps({"sample_id": 0, "input_ids": [1, 2]}) + "\n")
    tokenizer = Path(__file__).parents[1] / "examples" / "tokenizer"
    path = tmp_path / "datasets.yaml"
    path.write_text(f"model_profile: kimi-k2.5\ntokenizer: {tokenizer}\n{body}")
    return path


def test_modes_of_the_manifest_apply_to_its_chat_datasets(tmp_path: Path) -> None:
    path = manifest(tmp_path, """\
modes:
  - {name: think, weight: 3, chat_template_kwargs: {thinking: true}}
  - {name: direct, chat_template_kwargs: {thinking: false}, sampling: {temperature: 0.6}}
datasets:
  - {name: chat, path: chat.jsonl, input: messages, chat_template_kwargs: {extra: 1}}
  - {name: ids, path: ids.jsonl, input: input_ids}
""")
    loaded = load_manifest(path)
    chat, ids = loaded.datasets
    assert [(m.name, m.weight) for m in chat.mode_list()] == [("think", 3.0), ("direct", 1.0)]
    assert chat.template_kwargs("direct") == {"extra": 1, "thinking": False}
    assert chat.template_kwargs(None) == {"extra": 1}
    assert loaded.mode_sampling(chat, "direct").temperature == 0.6
    assert loaded.mode_sampling(chat, "think") == loaded.sampling_for(chat)
    assert ids.mode_list() == []


@pytest.mark.parametrize(("body", "message"), [
    ("  modes: [{name: a}, {name: a}]\n",
     r"datasets\.yaml:\d+: datasets\[0\]\.modes\[1\]\.name: duplicate name 'a'"),
    ("  modes: [{name: 'a b'}]\n", r"datasets\[0\]\.modes\[0\]\.name: 'a b' is not a mode name"),
    ("  modes: [{name: a, weight: 0}]\n", r"datasets\[0\]\.modes\[0\]\.weight: expected float > 0.0, got 0"),
    ("  modes: [{name: a, sampling: {top_k: 0}}]\n", r"datasets\[0\]\.modes\[0\]\.sampling\.top_k"),
    ("  modes: []\n", r"datasets\[0\]\.modes: expected at least one mode"),
    ("  modes: {from: nowhere.jsonl}\n", r"datasets\[0\]\.modes\.from: file not found"),
])
def test_bad_modes_are_named_by_key_and_line(tmp_path: Path, body: str, message: str) -> None:
    path = manifest(tmp_path, "datasets:\n- name: chat\n  path: chat.jsonl\n  input: messages\n"
                    + body)
    with pytest.raises(ConfigError, match=message):
        load_manifest(path)


def test_template_arguments_need_a_chat_input(tmp_path: Path) -> None:
    path = manifest(tmp_path, "datasets:\n- name: ids\n  path: ids.jsonl\n  input: input_ids\n"
                    "  modes: [{name: a, chat_template_kwargs: {thinking: false}}]\n")
    with pytest.raises(ConfigError, match=r"modes\[0\]\.chat_template_kwargs: only applies"):
        load_manifest(path)


def test_modes_from_a_deployment_sample(tmp_path: Path) -> None:
    sample = tmp_path / "requests.jsonl"
    sample.write_text('{"chat_template_kwargs": {"thinking": false}}\n' * 1
                      + '{"chat_template_kwargs": {"thinking": true}}\n' * 3)
    path = manifest(tmp_path, "modes: {from: requests.jsonl}\ndatasets:\n- name: chat\n"
                    "  path: chat.jsonl\n  input: messages\n")
    chat = load_manifest(path).datasets[0]
    assert [(m.name, m.weight, m.chat_template_kwargs) for m in chat.mode_list()] == [
        ("thinking=true", 3.0, {"thinking": True}), ("thinking=false", 1.0, {"thinking": False})]
    assert chat.modes_source == str(sample.resolve())


def test_keeping_what_an_earlier_session_drew_changes_nothing_else() -> None:
    order = list(range(300))
    random.Random(4).shuffle(order)
    whole = draw(order, [0.75, 0.25], "s")
    first = {k: whole[k] for k in order[:40]}  # a capped first session's draws
    assert draw(order, [0.75, 0.25], "s", first) == whole


def test_mode_names_from_arguments_are_safe_and_distinct(tmp_path: Path) -> None:
    assert mode_name({"effort": "very high", "thinking": True}) == "effort=very_high,thinking=true"
    path = tmp_path / "requests.jsonl"
    path.write_text('{"chat_template_kwargs": {"e": "a b"}}\n{"chat_template_kwargs": {"e": "a/b"}}\n')
    assert [m.name for m in deployment_mix(path, "r")] == ["e=a_b", "e=a_b-2"]


@pytest.mark.parametrize(("body", "message"), [
    ("  modes: {from: r.jsonl, extra: 1}\n", r"datasets\[0\]\.modes\.extra: unknown key \(known: from\)"),
    ("  modes: [{name: a, wieght: 2}]\n", r"datasets\[0\]\.modes\[0\]\.wieght: unknown key \(known: "
     r"chat_template_kwargs, name, sampling, weight\)"),
])
def test_a_mistyped_key_of_modes_lists_the_known_ones(tmp_path: Path, body: str,
                                                      message: str) -> None:
    path = manifest(tmp_path, "datasets:\n- name: chat\n  path: chat.jsonl\n  input: messages\n"
                    + body)
    with pytest.raises(ConfigError, match=message):
        load_manifest(path)
