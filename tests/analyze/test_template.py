"""Near-duplicate prompts judged on what differs: a dataset's template left out, in the sketch,
in validate (and its cache as prompts grow) and in generate's ``dedup: near``."""

from __future__ import annotations

import json
import random
from pathlib import Path
from typing import Any

import numpy as np
import pytest
from conftest import workbench
from test_validate import findings, plant, record, write_run_json

from workbench import sketch
from workbench.analyze import reply_template
from workbench.analyze.validate import validate_run
from workbench.rundir import figures
from workbench.rundir.records import PromptRecord, encode_line

_RNG = random.Random(1)
TEMPLATE = [_RNG.randrange(1000, 9000) for _ in range(300)]  # a system prompt, tool schemas


def question(seed: int, length: int = 50) -> list[int]:
    rng = random.Random(seed)
    return [rng.randrange(10_000, 60_000) for _ in range(length)]


def changed(ids: list[int], count: int, seed: int = 7) -> list[int]:
    """ids with `count` of them replaced, apart from each other."""
    out = list(ids)
    for position in random.Random(seed).sample(range(0, len(ids), 4), count):
        out[position] = 90_000 + position
    return out


def templated(body: list[int]) -> list[int]:
    return [*TEMPLATE[:250], *body, *TEMPLATE[250:]]


def rows(prompts: list[list[int]]) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    lengths = np.array([len(p) for p in prompts])
    ends = np.cumsum(lengths)
    return np.concatenate([np.array(p, dtype=np.int64) for p in prompts]), ends - lengths, ends


def estimate(sigs: np.ndarray, a: int, b: int) -> float:
    return float(np.mean(sigs[a] == sigs[b]))


def test_the_template_is_found_and_prompts_compare_on_their_questions() -> None:
    prompts = [templated(question(i)) for i in range(40)]
    prompts.append(templated(changed(question(3), 2)))  # a near copy of the fourth
    flat, starts, ends = rows(prompts)
    template = sketch.template_shingles(flat, starts, ends)
    assert 290 <= len(template.shingles) <= 300 and template.rows == 41
    whole = sketch.signatures(flat, starts, ends)
    varying = sketch.signatures(flat, starts, ends, exclude=template.shingles)
    assert estimate(whole, 0, 1) > 0.7  # different questions alike under the template
    assert estimate(varying, 0, 1) < 0.1  # and not once it is left out
    assert estimate(varying, 3, 40) > 0.6  # two ids of fifty changed
    assert sketch.near_duplicates(varying, sketch.PROMPT_THRESHOLD).tolist() == [-1] * 40 + [3]
    assert "without their template, 29" in template.text()


@pytest.mark.parametrize("share", [0.2, 0.5, 0.9, 1.0])
def test_the_template_is_each_shingle_held_by_the_share_of_distinct_rows(share: float) -> None:
    """Against a count of each shingle's rows with Python sets: pieces of a template that
    some rows hold, each in a few rows of many, copies counted once."""
    rng = random.Random(5)
    prompts = [[*TEMPLATE[:rng.randrange(0, 300)], *question(i, rng.randrange(0, 40)),
                *TEMPLATE[rng.randrange(100, 300):]] for i in range(300)]
    prompts += prompts[:50]  # copies
    flat, starts, ends = rows(prompts)
    hashes, row = sketch.ngram_hashes(flat, starts, ends, sketch.DEFAULT_SHINGLE)
    holders: dict[int, set[int]] = {}
    for value, index in zip(hashes.tolist(), row.tolist(), strict=True):
        holders.setdefault(value, set()).add(index)
    need = max(2, int(np.ceil(share * 300 - 1e-9)))  # 300 distinct rows
    expected = sorted(value for value, held in holders.items()
                      if len({tuple(prompts[i]) for i in held}) >= need)
    template = sketch.template_shingles(flat, starts, ends, share=share)
    assert template.rows == 300 and template.shingles.tolist() == expected
    assert share == 1.0 or len(expected) > 10


def test_copies_count_once_and_few_rows_make_no_template() -> None:
    copies = [question(0)] * 30 + [question(i) for i in range(1, 11)]
    template = sketch.template_shingles(*rows(copies))
    assert len(template.shingles) == 0 and template.rows == 11  # 30 copies: one distinct row
    few = [templated(question(i)) for i in range(sketch.template.MIN_TEMPLATE_ROWS - 1)]
    assert len(sketch.template_shingles(*rows(few)).shingles) == 0
    assert sketch.Template(np.zeros(0, np.uint64), 9, 0.5).text() == "whole prompts"


def test_a_row_of_template_only_keeps_its_shingles() -> None:
    prompts = [templated(question(i)) for i in range(20)] + [TEMPLATE, TEMPLATE[:-1]]
    flat, starts, ends = rows(prompts)
    template = sketch.template_shingles(flat, starts, ends)
    sigs = sketch.signatures(flat, starts, ends, exclude=template.shingles)
    assert estimate(sigs, 20, 21) > 0.9  # compared whole: nothing else to compare
    assert estimate(sigs, 0, 20) < 0.1


def planted_run(out: Path, count: int = 40) -> None:
    """Dataset a: `count` prompts under one template, the last three near copies of earlier
    ones (two or three ids of fifty changed)."""
    bodies = [question(i) for i in range(count - 3)]
    bodies += [changed(bodies[5], 2), changed(bodies[9], 3, seed=8), changed(bodies[20], 2, seed=9)]
    prompts = [PromptRecord(sample_id=i, input_ids=templated(body)) for i, body in enumerate(bodies)]
    plant(out, "a", [record(i) for i in range(count)])
    (out / "a" / "prompts.jsonl").write_bytes(b"".join(encode_line(p) for p in prompts))
    write_run_json(out, model_profile="kimi-k2.5", datasets=[{"name": "a"}])


def test_validate_finds_near_copies_under_a_template_and_says_what_it_compared(tmp_path: Path) -> None:
    planted_run(tmp_path)
    found = findings(validate_run(tmp_path, workers=1), "a")["near_duplicate_prompt"]
    assert found.count == 3
    assert [e.line for e in found.examples] == [38, 39, 40]
    assert "nearly the same as a sample_id 5 (compared: prompts without their template, " \
           "29" in found.examples[0].detail  # the 298 shingles of its 300 ids, or so
    assert "shingles held by 50%+ of the first 40)" in found.examples[0].detail
    strict = workbench("validate", str(tmp_path), "--template-share", "1", "--json")
    assert strict.returncode == 0, strict.stderr
    counts = {f["rule"]: f["count"] for f in json.loads(strict.stdout)["datasets"]["a"]["findings"]}
    assert counts["near_duplicate_prompt"] == 3  # a template every prompt holds: the same


def test_a_fixed_template_keeps_the_kept_figures_as_prompts_grow(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(sketch, "TEMPLATE_ROWS", 20)
    monkeypatch.setattr(sketch.template, "TEMPLATE_ROWS", 20)
    computed: list[int] = []
    block_figures = figures._block_figures

    def counting(block: Any, chosen: list[int], exclude: np.ndarray) -> Any:
        computed.append(len(chosen))
        return block_figures(block, chosen, exclude)

    monkeypatch.setattr(figures, "_block_figures", counting)
    path = tmp_path / "prompts.jsonl"

    def append(first: int, last: int) -> None:
        with open(path, "ab") as file:
            file.writelines(encode_line(PromptRecord(sample_id=i, input_ids=templated(question(i))))
                            for i in range(first, last))

    append(0, 15)  # fewer than the template's rows: drawn again once the file grows
    small = figures.prompt_figures(path)
    assert not small.template_whole and small.template_rows == 15
    append(15, 30)
    computed.clear()
    grown = figures.prompt_figures(path)
    assert sum(computed) == 30 and grown.template_whole and grown.template_rows == 20
    append(30, 40)
    computed.clear()
    again = figures.prompt_figures(path)
    assert sum(computed) == 10 and again.template == grown.template  # only what grew
    assert again.signature[:30] == grown.signature


def test_generate_skips_near_copies_under_a_template_and_keeps_other_questions(
    tmp_path: Path, shared_sim: Any
) -> None:
    rng = random.Random(3)
    bodies = [" ".join(f"w{rng.randrange(5000)}" for _ in range(50)) for _ in range(30)]
    system = " ".join(f"t{i}" for i in range(300))
    copy = bodies[4].split()
    copy[10], copy[30] = "changed", "words"
    texts = [*bodies, " ".join(copy)]
    data = tmp_path / "rows.jsonl"
    data.write_text("".join(json.dumps({"sample_id": i, "text": f"{system} {t} end of prompt"}) + "\n"
                            for i, t in enumerate(texts)))
    manifest = tmp_path / "datasets.yaml"
    manifest.write_text(f"model_profile: kimi-k2.5\ndedup: near\ndatasets:\n"
                        f"  - {{name: a, path: {data}, input: text, max_samples: 40,"
                        f" sampling: {{max_new_tokens: 8}}}}\n")
    done = workbench("generate", "--datasets", str(manifest), "--server", shared_sim.url,
                     "--out", str(tmp_path / "out"))
    assert done.returncode == 0, done.stderr
    skipped = [json.loads(line) for line in (tmp_path / "out/a/skipped.jsonl").read_text().splitlines()]
    assert skipped == [{"sample_id": 30, "rule": "near_duplicate", "of": {"dataset": "a", "sample_id": 4}}]
    assert "1 near duplicates skipped (compared: prompts without their template, 299 shingles " \
           "held by 50%+ of the first 31)" in done.stdout  # 298 of the system prompt, 1 of the end


def test_replies_alike_by_their_boilerplate_only_are_not_near_duplicates(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Tool calls: 60 ids of markers and JSON keys around 20 ids of arguments. Different calls
    share three quarters of their shingles; a call with one argument id changed is a copy.
    A grown run reads only what grew."""
    monkeypatch.setattr(sketch, "TEMPLATE_ROWS", 20)
    monkeypatch.setattr(sketch.template, "TEMPLATE_ROWS", 20)
    boiler = TEMPLATE[:60]

    def call(seed: int) -> list[int]:
        return [*boiler[:40], *question(seed, 20), *boiler[40:]]

    calls = [call(i) for i in range(40)]
    copy = list(calls[7])
    copy[50] = 99_999
    plant(tmp_path, "a", [record(i, ids) for i, ids in enumerate([*calls, copy])])
    write_run_json(tmp_path, model_profile="kimi-k2.5", datasets=[{"name": "a"}])
    whole = sketch.signatures(*rows(calls[:2]))
    assert estimate(whole, 0, 1) >= sketch.DEFAULT_THRESHOLD  # alike, compared whole
    found = findings(validate_run(tmp_path, workers=1), "a")["near_duplicate_reply"]
    assert found.count == 1 and found.examples[0].line == 41
    assert "nearly the same as a sample_id 7 (compared: replies without their template, " \
           in found.examples[0].detail
    assert "held by 50%+ of the first 20)" in found.examples[0].detail
    offsets: list[int] = []
    read = reply_template.iter_blocks

    def spying(path: Path, **options: Any) -> Any:
        offsets.append(options["offset"])
        return read(path, **options)

    monkeypatch.setattr(reply_template, "iter_blocks", spying)
    raw = tmp_path / "a" / "raw_responses.jsonl"
    size = raw.stat().st_size
    with open(raw, "ab") as file:
        file.write(encode_line(record(41, call(41))))
    again = findings(validate_run(tmp_path, workers=1), "a")["near_duplicate_reply"]
    assert again.count == 1 and offsets == [size]  # the template kept, the new reply read
