"""The reply figures generate keeps as it writes: equal to what validate computes, found by
content (an edited reply is computed again), and never a reason for a run to fail."""

from __future__ import annotations

import errno
import json
import os
import random
from pathlib import Path

import msgspec
import numpy as np
import pytest
from conftest import BENCH, EXAMPLES, generate_run, text_prompts, workbench, write_manifest

from workbench import sketch
from workbench.analyze.scan import scan_run
from workbench.profiles import get_profile
from workbench.rundir.figures import (
    ENTRY,
    OVERLAP_ENTRY,
    FigureAppender,
    figures_path,
    load_figures,
    overlaps_path,
    prompt_figures,
    reply_figures,
    reply_overlaps,
)
from workbench.rundir.layout import RAW_FILE
from workbench.server.launch import ServerProcess
from workbench.sketch import Decontamination
from workbench.tokenizer import load_tokenizer

KIMI = get_profile("kimi-k2.5")
TE = KIMI.think_end
assert TE is not None


def replies(count: int, seed: int = 0) -> list[list[int]]:
    """Replies of random ids, some with a loop, most with a think-end id somewhere."""
    rng = random.Random(seed)
    out = []
    for index in range(count):
        body = [rng.randrange(0, 3000) for _ in range(rng.randrange(1, 600))]
        if index % 3 == 0:
            body = body[:40] + [7, 8, 9, 10, 11, 12, 13] * rng.randrange(5, 40) + body[40:]
        if index % 4:
            body.insert(rng.randrange(0, len(body)), TE)
        out.append(body)
    return out


def flat(rows: list[list[int]]) -> tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray]:
    lengths = np.array([len(r) for r in rows], dtype=np.int64)
    ends = np.cumsum(lengths)
    starts = ends - lengths
    ids = np.array([i for r in rows for i in r], dtype=np.int64)
    split = np.array([r.index(TE) if TE in r else -1 for r in rows], dtype=np.int64)
    return ids, starts, ends, split


def test_kept_figures_equal_the_computed_ones_and_are_found_by_content(tmp_path: Path) -> None:
    rows = replies(150)
    appender = FigureAppender(tmp_path, TE, 10, batch=32)
    for row in rows:
        appender.add(row)
    appender.close()
    assert appender.failed is None
    store = load_figures(appender.path)
    assert store is not None and len(store) == len(rows)
    ids, starts, ends, split = flat(rows)
    computed = reply_figures(ids, starts, ends, split, 10)
    kept = reply_figures(ids, starts, ends, split, 10, known=store)
    assert (computed.repeat[::3] > 0.05).all()  # the loops are there, and scored
    assert (computed.repeat[1::3] == 0).mean() > 0.9
    np.testing.assert_array_equal(kept.digest, computed.digest)
    np.testing.assert_array_equal(kept.repeat, computed.repeat)
    np.testing.assert_array_equal(kept.signature, computed.signature)
    # the scan's own computation, row by row, gives the same shares
    one = sketch.split_repeat_share(ids, starts[:1], ends[:1], split[:1], 10)
    assert one[0] == computed.repeat[0]


def test_a_kept_entry_is_what_the_scan_takes_and_an_unknown_reply_is_computed(tmp_path: Path) -> None:
    rows = replies(4, seed=3)
    ids, starts, ends, split = flat(rows)
    computed = reply_figures(ids, starts, ends, split, 10)
    entries = np.zeros(1, dtype=ENTRY)  # an entry for row 1's content, with figures of its own
    entries["digest"] = computed.digest[1]
    entries["repeat"] = 0.625
    entries["signature"] = 7
    path = figures_path(tmp_path, TE, 10)
    path.parent.mkdir(parents=True)
    path.write_bytes(entries.tobytes() + b"\0" * 11)  # and a torn entry after it
    store = load_figures(path)
    assert store is not None and len(store) == 1
    kept = reply_figures(ids, starts, ends, split, 10, known=store)
    assert kept.repeat[1] == 0.625 and (kept.signature[1] == 7).all()
    for row in (0, 2, 3):
        assert kept.repeat[row] == computed.repeat[row]
        np.testing.assert_array_equal(kept.signature[row], computed.signature[row])


def test_a_torn_last_entry_is_cut_before_more_are_appended(tmp_path: Path) -> None:
    rows = replies(10, seed=4)
    path = figures_path(tmp_path, TE, 10)
    path.parent.mkdir(parents=True)
    path.write_bytes(b"\1" * (ENTRY.itemsize // 2))  # a crash mid-write
    appender = FigureAppender(tmp_path, TE, 10, batch=4)
    for row in rows:
        appender.add(row)
    appender.close()
    assert path.stat().st_size == len(rows) * ENTRY.itemsize
    store = load_figures(path)
    assert store is not None
    ids, starts, ends, split = flat(rows)
    assert (store.find(reply_figures(ids, starts, ends, split, 10).digest) >= 0).all()


def test_a_full_disk_stops_the_figures_not_the_run(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    appender = FigureAppender(tmp_path, None, 10, batch=2)
    real_write = os.write
    calls = {"n": 0}

    def full(fd: int, data: bytes) -> int:
        if fd == appender._figures._fd:
            calls["n"] += 1
            if calls["n"] > 1:  # the first batch goes down, the next one half, then no space
                real_write(fd, bytes(data)[:100])
                raise OSError(errno.ENOSPC, "No space left on device")
        return real_write(fd, data)

    monkeypatch.setattr(os, "write", full)
    for row in replies(8, seed=5):
        appender.add(row)  # never raises
    appender.close()
    assert appender.failed is not None and "No space left" in appender.failed
    assert appender.path.stat().st_size == 2 * ENTRY.itemsize  # the half entry cut back


def test_generate_keeps_the_figures_and_validate_reads_the_same_with_or_without_them(
    tmp_path: Path, shared_sim: ServerProcess,
) -> None:
    out = generate_run(tmp_path, [
        {"name": "chat", "path": str(EXAMPLES / "data/glaive_fc.jsonl"), "input": "messages",
         "max_samples": 40, "chat_template_kwargs": {"thinking": True}},
        {"name": "plain", "path": str(EXAMPLES / "data/glaive_fc.jsonl"), "input": "messages",
         "max_samples": 20, "chat_template_kwargs": {"thinking": False}},
    ], shared_sim)
    for name, think_end in (("chat", TE), ("plain", None)):
        store = load_figures(figures_path(out / name, think_end, 10))
        records = (out / name / RAW_FILE).read_text().splitlines()
        assert store is not None and len(store) == len(records), name
    # an edited reply (same length on disk) is not taken from the store
    raw = out / "chat" / RAW_FILE
    lines = raw.read_bytes().splitlines(keepends=True)
    edited = json.loads(lines[3])
    ids = edited["output_ids"]
    ids[5:5 + 30] = [ids[5]] * 30  # now a loop
    lines[3] = msgspec.json.encode(edited) + b"\n"
    raw.write_bytes(b"".join(lines))
    with_store = scan_run(out, cache=False, figures=True, workers=1)
    without = scan_run(out, cache=False, figures=False, workers=1)
    for name in ("chat", "plain"):
        a, b = with_store.files[name].columns, without.files[name].columns
        assert a.repeat_share == b.repeat_share and a.digest == b.digest
        assert a.signature == b.signature and a.failed == b.failed
    assert with_store.report == without.report
    assert with_store.files["chat"].columns.repeat_share[3] > 0.05


def test_validate_takes_the_kept_figures_instead_of_computing_them(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, shared_sim: ServerProcess,
) -> None:
    out = generate_run(tmp_path, [
        {"name": "chat", "path": str(EXAMPLES / "data/glaive_fc.jsonl"), "input": "messages",
         "max_samples": 24, "chat_template_kwargs": {"thinking": True}},
    ], shared_sim)
    computed: list[int] = []
    original = sketch.row_figures

    def counting(ids: np.ndarray, starts: np.ndarray, *args: object,
                 **kwargs: object) -> sketch.RowFigures:
        computed.append(len(starts))
        return original(ids, starts, *args, **kwargs)  # type: ignore[arg-type]

    signed: list[int] = []
    signatures = sketch.signatures

    def counting_signatures(ids: np.ndarray, starts: np.ndarray, *args: object,
                            **kwargs: object) -> np.ndarray:
        signed.append(len(starts))
        return signatures(ids, starts, *args, **kwargs)  # type: ignore[arg-type]

    monkeypatch.setattr(sketch, "row_figures", counting)
    monkeypatch.setattr(sketch, "signatures", counting_signatures)
    kept = scan_run(out, cache=False, figures=True, workers=1)
    assert sum(computed) == 0 and sum(signed) == 0  # replies' and prompts' figures taken
    again = scan_run(out, cache=False, figures=False, workers=1)
    assert sum(computed) == 24 and sum(signed) == 24  # computed: 24 replies, 24 prompts
    assert kept.report == again.report


def test_generate_keeps_the_overlaps_with_its_benchmarks_and_validate_takes_them(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, shared_sim: ServerProcess,
) -> None:
    manifest = write_manifest(tmp_path, [{"name": "t", "path": str(text_prompts(tmp_path, 16)),
                                          "input": "text", "max_samples": 16}])
    done = workbench("generate", "--datasets", str(manifest), "--server", shared_sim.url,
                     "--out", str(tmp_path / "out"), "--decontaminate", str(BENCH))
    assert done.returncode == 0, done.stderr
    out = tmp_path / "out"
    decontaminate = Decontamination.load([BENCH], tokenizer=load_tokenizer(EXAMPLES / "tokenizer"))
    store = load_figures(overlaps_path(out / "t", decontaminate), OVERLAP_ENTRY)
    assert store is not None and len(store) == 16
    words: list[int] = []
    original = sketch.PieceDecoder.words

    def counting(self: sketch.PieceDecoder, ids: np.ndarray, starts: np.ndarray,
                 ends: np.ndarray) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
        words.append(len(starts))
        return original(self, ids, starts, ends)

    monkeypatch.setattr(sketch.PieceDecoder, "words", counting)
    kept = scan_run(out, cache=False, figures=True, workers=1, decontaminate=decontaminate)
    assert sum(words) == 0  # neither the replies' nor the prompts' ids read as words again
    again = scan_run(out, cache=False, figures=False, workers=1, decontaminate=decontaminate)
    assert sum(words) >= 16
    assert kept.report == again.report
    assert kept.files["t"].columns.overlap == again.files["t"].columns.overlap
    found = {f.rule: f.count for f in kept.report.datasets["t"].findings}
    assert found.get("contaminated_prompt") == 4  # samples 0, 4, 8 and 12 quote tb-3


def test_a_kept_overlap_is_what_the_scan_takes(tmp_path: Path) -> None:
    decontaminate = Decontamination.load([BENCH], tokenizer=load_tokenizer(EXAMPLES / "tokenizer"))
    rows = replies(3, seed=8)
    ids, starts, ends, _ = flat(rows)
    digest = sketch.digest(ids, starts, ends)
    entries = np.zeros(1, dtype=OVERLAP_ENTRY)
    entries["digest"], entries["overlap"] = digest[2], 0b101
    path = overlaps_path(tmp_path, decontaminate)
    path.parent.mkdir(parents=True)
    path.write_bytes(entries.tobytes())
    store = load_figures(path, OVERLAP_ENTRY)
    taken = reply_overlaps(ids, starts, ends, digest, decontaminate, store)
    assert taken.tolist() == [0, 0, 0b101]  # random ids quote nothing; row 2's entry is taken


def test_generate_names_a_bad_benchmark_line_before_sending(tmp_path: Path) -> None:
    bad = tmp_path / "bench.jsonl"
    bad.write_text('{"question": "fine"}\n{"question": \n')
    manifest = write_manifest(tmp_path, [{"name": "t", "path": str(text_prompts(tmp_path, 4)),
                                          "input": "text"}])
    done = workbench("generate", "--datasets", str(manifest), "--server", "http://127.0.0.1:9",
                     "--out", str(tmp_path / "out"), "--decontaminate", str(bad))
    assert done.returncode == 2
    assert f"{bad}:2" in done.stderr and len(done.stderr.strip().splitlines()) == 1
    assert not (tmp_path / "out" / "t" / RAW_FILE).exists()


def test_prompt_figures_stopped_early_keep_what_was_read_and_finish_later(tmp_path: Path) -> None:
    rng = random.Random(2)
    path = tmp_path / "prompts.jsonl"
    with open(path, "wb") as out:  # about 3 MB: several blocks
        for i in range(3000):
            ids = [rng.randrange(0, 150000) for _ in range(150)]
            out.write(msgspec.json.encode({"sample_id": i % 2900, "input_ids": ids}) + b"\n")
    whole = prompt_figures(path, cache=False)
    assert len(whole.line) == 2900  # each sample id's first line
    partial = prompt_figures(path, stop=lambda: True)  # stopped after its first block
    assert 0 < len(partial.line) < 2900
    assert prompt_figures(path) == whole  # the rest read, what was kept taken
