"""Sketches of replies: loops, exact and near duplicates, benchmark overlap, ids to words."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
import pytest
from conftest import EXAMPLES

from workbench import sketch
from workbench.errors import DataError
from workbench.sketch import (
    Benchmarks,
    PieceDecoder,
    digest,
    exact_duplicates,
    minhash,
    near_duplicates,
    ngram_hashes,
    normalise_words,
    repeat_share,
    repeats,
    signatures,
    word_hashes,
)

VOCAB = 160_000


def flat(rows: Sequence[Any]) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """The scan's layout: (ids, starts, ends) of rows back to back."""
    lengths = np.array([len(r) for r in rows], dtype=np.int64)
    ends = np.cumsum(lengths)
    ids = np.concatenate([np.asarray(r, dtype=np.int64) for r in rows]) if rows else np.zeros(0)
    return ids.astype(np.int64), ends - lengths, ends


def random_row(rng: np.random.Generator, length: int) -> np.ndarray:
    return rng.integers(0, VOCAB, length)


def shingle_set(row: np.ndarray, n: int) -> set[tuple[int, ...]]:
    return {tuple(row[i:i + n].tolist()) for i in range(len(row) - n + 1)}


def estimated(sigs: np.ndarray, a: int, b: int) -> float:
    return float(np.mean(sigs[a] == sigs[b]))


# --- repeat_share -----------------------------------------------------------------------------


def test_a_reply_looping_over_its_second_half_scores_about_a_half() -> None:
    rng = np.random.default_rng(0)
    pattern = random_row(rng, 7)
    looping = np.concatenate([random_row(rng, 1000), np.tile(pattern, 143)[:1000]])
    share = repeat_share(*flat([looping, random_row(rng, 2000), looping[:19]]))
    assert share.dtype == np.float32
    assert share[0] == pytest.approx(0.5, abs=0.02)
    assert share[1] < 0.01  # a random reply repeats no 10-gram
    assert share[2] == 0  # shorter than 2n


def test_repeat_share_counts_a_loop_of_any_period_and_keeps_rows_apart() -> None:
    rng = np.random.default_rng(1)
    head = random_row(rng, 600)
    long_loop = np.concatenate([head, np.tile(random_row(rng, 150), 4)])  # period 150 > n
    # the same 10-grams in two different rows are not a repeat of either
    shared = random_row(rng, 300)
    ids, starts, ends = flat([long_loop, shared, shared])
    share = repeat_share(ids, starts, ends, n=10)
    assert share[0] == pytest.approx(600 / 1200, abs=0.02)
    assert share[1] == 0 and share[2] == 0


def test_rows_need_not_be_back_to_back() -> None:
    rng = np.random.default_rng(2)
    looping = np.concatenate([random_row(rng, 100), np.tile([1, 2, 3], 34)[:100]])
    other = random_row(rng, 200)
    ids = np.concatenate([other, looping])
    share = repeat_share(ids, [200, 0], [400, 200])
    assert share[0] == pytest.approx(0.5, abs=0.05)
    assert share[1] < 0.05
    assert digest(ids, [200], [400])[0] == digest(looping, [0], [200])[0]


def test_repeat_share_does_not_depend_on_the_block(monkeypatch: pytest.MonkeyPatch) -> None:
    rng = np.random.default_rng(10)
    rows = [np.concatenate([random_row(rng, int(n)), np.tile(random_row(rng, int(p)), 9)])
            for n, p in zip(rng.integers(0, 300, 30), rng.integers(1, 30, 30), strict=True)]
    whole = repeat_share(*flat(rows))
    assert (whole > 0.05).all()
    monkeypatch.setattr(repeats, "CHUNK_IDS", 100)  # many small parts
    assert np.array_equal(repeat_share(*flat(rows)), whole)
    assert np.array_equal(repeat_share(*flat(rows[3:5])), whole[3:5])


# --- digests ----------------------------------------------------------------------------------


def test_equal_sequences_have_equal_digests_and_others_differ() -> None:
    rng = np.random.default_rng(3)
    row = random_row(rng, 500)
    changed = row.copy()
    changed[250] += 1
    swapped = row.copy()
    swapped[[10, 11]] = swapped[[11, 10]]
    rows = [row, random_row(rng, 30), row, changed, swapped, row[:-1], [], [], [0], [0, 0]]
    got = digest(*flat(rows))
    assert got.dtype == np.uint64
    assert got[0] == got[2] and got[6] == got[7]
    assert len(set(got[[0, 1, 3, 4, 5, 6, 8, 9]].tolist())) == 8
    assert exact_duplicates(got).tolist() == [-1, -1, 0, -1, -1, -1, -1, 6, -1, -1]


def test_exact_duplicates_points_at_the_first_earlier_equal_value() -> None:
    values = np.array([5, 7, 5, 9, 7, 5], dtype=np.uint64)
    assert exact_duplicates(values).tolist() == [-1, -1, 0, -1, 1, 0]
    assert exact_duplicates(np.zeros(0, dtype=np.uint64)).tolist() == []


# --- signatures -------------------------------------------------------------------------------


def test_identical_rows_have_identical_signatures_and_unrelated_ones_differ() -> None:
    rng = np.random.default_rng(4)
    row = random_row(rng, 800)
    sigs = signatures(*flat([row, random_row(rng, 800), row]), shingle=5, num_perm=64)
    assert sigs.shape == (3, 64) and sigs.dtype == np.uint64
    assert estimated(sigs, 0, 2) == 1.0
    assert estimated(sigs, 0, 1) < 0.05


def test_the_estimate_follows_the_true_jaccard() -> None:
    rng = np.random.default_rng(5)
    base = random_row(rng, 3000)
    near = base.copy()
    near[rng.choice(3000, 20, replace=False)] = rng.integers(0, VOCAB, 20)  # ~97% shared shingles
    half = base.copy()
    half[1500:] = random_row(rng, 1500)
    sigs = signatures(*flat([base, near, half]), shingle=5, num_perm=128)
    for other in (1, 2):
        a, b = shingle_set(base, 5), shingle_set([base, near, half][other], 5)
        truth = len(a & b) / len(a | b)
        assert estimated(sigs, 0, other) == pytest.approx(truth, abs=0.1)
    assert 0.2 < estimated(sigs, 0, 2) < 0.5  # about a third: the estimate is not always 1


def test_rows_sharing_nine_tenths_of_their_shingles_estimate_near_that() -> None:
    rng = np.random.default_rng(6)
    base = random_row(rng, 2000)
    other = base.copy()
    other[::60] = random_row(rng, len(other[::60]))  # each change breaks 3 shingles of 3
    a, b = shingle_set(base, 3), shingle_set(other, 3)
    truth = len(a & b) / len(a | b)
    assert 0.8 < truth < 0.95
    sigs = signatures(*flat([base, other]), shingle=3, num_perm=128)
    assert estimated(sigs, 0, 1) == pytest.approx(truth, abs=0.1)


def test_short_rows_are_one_shingle_and_empty_bins_are_filled() -> None:
    rows = [[1, 2], [1, 2], [2, 1], [], [], [7, 8, 9, 10, 11, 12]]
    sigs = signatures(*flat(rows), shingle=5, num_perm=32)
    assert estimated(sigs, 0, 1) == 1.0 and estimated(sigs, 3, 4) == 1.0
    assert estimated(sigs, 0, 2) == 0.0 and estimated(sigs, 0, 3) == 0.0
    assert (sigs < np.uint64(1 << 40)).all()  # no empty bin left
    assert len(set(sigs[5].tolist())) == 2  # two shingles: every bin holds one of them


def test_signatures_do_not_depend_on_the_block_or_the_process(monkeypatch: pytest.MonkeyPatch) -> None:
    rng = np.random.default_rng(7)
    rows = [random_row(rng, int(n)) for n in rng.integers(0, 400, 40)]
    whole = signatures(*flat(rows))
    monkeypatch.setattr(minhash, "CHUNK_IDS", 500)  # many small parts
    assert np.array_equal(signatures(*flat(rows)), whole)
    assert np.array_equal(signatures(*flat(rows[7:9])), whole[7:9])
    script = ("import json, sys, numpy as np; from workbench.sketch import signatures, "
              "word_hashes; rows = json.loads(sys.stdin.read()); "
              "ids = np.concatenate([np.array(r, dtype=np.int64) for r in rows]); "
              "ends = np.cumsum([len(r) for r in rows]); "
              "print(json.dumps([signatures(ids, ends - [len(r) for r in rows], ends)[:3].tolist(), "
              "word_hashes('Stable words, Across processes').tolist()]))")
    env = {**os.environ, "PYTHONHASHSEED": "12345"}
    done = subprocess.run([sys.executable, "-c", script], input=json.dumps([r.tolist() for r in rows]),
                          capture_output=True, text=True, env=env, check=True)
    other_sigs, other_words = json.loads(done.stdout)
    assert other_sigs == whole[:3].tolist()
    assert other_words == word_hashes("stable WORDS across: processes").tolist()


def test_signatures_take_word_hashes_too() -> None:
    text = " ".join(f"word{i % 97} token{i % 31}" for i in range(300))
    tokens = word_hashes(text)
    edited = word_hashes(text.replace("word5 ", "changed ", 1))
    sigs = signatures(np.concatenate([tokens, edited, word_hashes("something else " * 50)]),
                      [0, len(tokens), 2 * len(tokens)], [len(tokens), 2 * len(tokens), 2 * len(tokens) + 100])
    assert estimated(sigs, 0, 1) > 0.8
    assert estimated(sigs, 0, 2) < 0.1


# --- near duplicates --------------------------------------------------------------------------


def test_near_duplicates_finds_planted_copies_and_leaves_unrelated_rows() -> None:
    rng = np.random.default_rng(8)
    rows = [random_row(rng, int(n)) for n in rng.integers(200, 1500, 300)]
    planted = {}
    for source in (3, 50, 120, 121, 299):
        edited = rows[source].copy()
        changes = len(edited) // 25
        edited[rng.choice(len(edited), changes, replace=False)] = rng.integers(0, VOCAB, changes)
        planted[len(rows)] = source
        rows.append(edited)
    rows.append(rows[3].copy())  # an exact copy: the earliest partner is the original
    partner = near_duplicates(signatures(*flat(rows)))
    assert partner.dtype == np.int64
    for later, source in planted.items():
        assert partner[later] == source
    assert partner[len(rows) - 1] == 3
    assert (partner[:300] == -1).all()


def test_near_duplicates_drops_bucket_mates_below_the_threshold() -> None:
    rng = np.random.default_rng(9)
    base = random_row(rng, 2000)
    half = base.copy()
    half[1000:] = random_row(rng, 1000)  # Jaccard about 1/3
    sigs = signatures(*flat([base, half, base]))
    assert near_duplicates(sigs, threshold=0.9).tolist() == [-1, -1, 0]
    assert near_duplicates(sigs, threshold=0.2).tolist() == [-1, 0, 0]
    with pytest.raises(ValueError, match="threshold"):
        near_duplicates(sigs, threshold=1.5)


def test_lsh_bands_are_datasketchs_choice() -> None:
    from datasketch import MinHashLSH

    compared = 0
    for num_perm in (32, 64, 128, 256):
        for threshold in (x / 100 for x in range(10, 96, 5)):
            try:
                lsh = MinHashLSH(threshold=threshold, num_perm=num_perm)
            except ValueError:  # datasketch refuses a single band
                continue
            assert sketch.lsh_bands(threshold, num_perm) == (lsh.b, lsh.r), (threshold, num_perm)
            compared += 1
    assert compared > 60


def test_ngram_hashes_are_equal_for_equal_ngrams_in_any_row() -> None:
    hashes, rows = ngram_hashes(*flat([[1, 2, 3, 4], [9, 1, 2, 3], [1, 2]]), 3)
    assert rows.tolist() == [0, 0, 1, 1]
    assert hashes[0] == hashes[3] and len(set(hashes.tolist())) == 3


# --- words and benchmarks ---------------------------------------------------------------------


def test_normalise_words_folds_case_width_and_punctuation() -> None:
    assert normalise_words("Hello,World!  “Ｆｕｌｌ” width—dash\tok") == [
        "hello", "world", "full", "width", "dash", "ok"]
    assert np.array_equal(word_hashes("Hello, world"), word_hashes("hello WORLD!"))
    assert len(set(word_hashes("ab ba a b abc").tolist())) == 5
    assert word_hashes("...").dtype == np.uint64 and len(word_hashes("...")) == 0


ITEM = ("Natalia sold clips to forty eight of her friends in April, and then she sold half as "
        "many clips in May. How many clips did Natalia sell altogether?")


def write_jsonl(path: Path, records: list[object]) -> Path:
    path.write_text("".join(json.dumps(r) + "\n" for r in records))
    return path


def test_benchmarks_load_jsonl_and_parquet_and_flag_quoting_rows(tmp_path: Path) -> None:
    gsm = write_jsonl(tmp_path / "gsm8k.jsonl", [{"question": ITEM, "answer": "72"},
                                                  {"question": "Too short to count."}])
    haiku_prompt = "Write a haiku about the sea and the sky over the harbour at dawn please"
    table = pa.table({"id": [1, 2], "turns": [[haiku_prompt, "now in French"], ["hi"]]})
    pq.write_table(table, tmp_path / "mtbench.parquet")
    bench = Benchmarks.load([gsm, tmp_path / "mtbench.parquet"])
    first, second = bench.benchmarks
    assert (first.name, first.field, first.items, first.skipped) == ("gsm8k", "question", 2, 1)
    assert (second.name, second.field, second.items, second.skipped) == ("mtbench", "turns", 2, 1)
    words = ITEM.split()
    quoted = "Sure! " + " ".join(words[3:16]).upper().replace(",", ";") + " -- that is all."
    twelve = "Sure! " + " ".join(words[3:15]) + " -- that is all."
    haiku = "write a haiku about the sea, and the sky over the harbour at dawn"
    texts = [quoted, twelve, haiku, quoted + " " + haiku, ""]
    rows = [word_hashes(t) for t in texts]
    tokens = np.concatenate(rows)
    ends = np.cumsum([len(r) for r in rows])
    assert bench.overlaps(tokens, ends - [len(r) for r in rows], ends).tolist() == [1, 0, 2, 3, 0]


def test_benchmark_errors_name_the_file_and_line_or_column(tmp_path: Path) -> None:
    bad = tmp_path / "bad.jsonl"
    bad.write_text(json.dumps({"prompt": ITEM}) + "\n\n{not json\n")
    with pytest.raises(DataError, match=r"bad\.jsonl:3: not JSON"):
        Benchmarks.load([bad])
    missing = write_jsonl(tmp_path / "missing.jsonl", [{"prompt": ITEM}, {"question": ITEM}])
    with pytest.raises(DataError, match=r"missing\.jsonl:2: no field 'prompt'"):
        Benchmarks.load([missing])
    with pytest.raises(DataError, match=r"missing\.jsonl:1: no field 'query'"):
        Benchmarks.load([missing], field="query")
    unknown = write_jsonl(tmp_path / "unknown.jsonl", [{"body": ITEM}])
    with pytest.raises(DataError, match=r"unknown\.jsonl:1: no prompt field .*prompt, question"):
        Benchmarks.load([unknown])
    pq.write_table(pa.table({"body": [ITEM]}), tmp_path / "cols.parquet")
    with pytest.raises(DataError, match=r"cols\.parquet: no column 'query' \(columns: body\)"):
        Benchmarks.load([tmp_path / "cols.parquet"], field="query")
    pq.write_table(pa.table({"prompt": [ITEM, None]}), tmp_path / "nulls.parquet")
    with pytest.raises(DataError, match=r"nulls\.parquet: column 'prompt', row 1: not text"):
        Benchmarks.load([tmp_path / "nulls.parquet"])
    (tmp_path / "junk.parquet").write_bytes(b"not parquet at all")
    with pytest.raises(DataError, match=r"junk\.parquet: not a readable Parquet file"):
        Benchmarks.load([tmp_path / "junk.parquet"])


def test_benchmark_digests_follow_content_n_and_field(tmp_path: Path) -> None:
    path = write_jsonl(tmp_path / "a.jsonl", [{"prompt": ITEM, "text": "other words " * 10}])
    same = Benchmarks.load([path]).digest
    assert Benchmarks.load([path]).digest == same
    assert Benchmarks.load([path], n=8).digest != same
    assert Benchmarks.load([path], field="text").digest != same
    write_jsonl(path, [{"prompt": ITEM + " Explain."}])
    assert Benchmarks.load([path]).digest != same


def test_benchmarks_with_the_same_stem_keep_apart(tmp_path: Path) -> None:
    for name in ("mmlu", "gsm8k"):
        (tmp_path / name).mkdir()
        write_jsonl(tmp_path / name / "test.jsonl", [{"prompt": ITEM}])
    bench = Benchmarks.load([tmp_path / "mmlu" / "test.jsonl", tmp_path / "gsm8k" / "test.jsonl"])
    assert bench.names == ["test", "gsm8k/test"]


# --- ids to words -----------------------------------------------------------------------------


def example_tokenizer() -> Any:
    pytest.importorskip("transformers")
    from workbench.tokenizer import load_tokenizer

    return load_tokenizer(EXAMPLES / "tokenizer")


def test_piece_decoder_words_match_the_tokenizers_decode() -> None:
    tokenizer = example_tokenizer()
    decoder = PieceDecoder(tokenizer)
    texts = ["hello world , the cat did keep going .", "two things ; then either way",
             "the weather was unpleasant , though ."]
    rows = [tokenizer.encode(t, add_special_tokens=False) for t in texts]
    rows.insert(1, [*rows[0], 10**9, -5, *rows[2]])  # ids outside the vocabulary are nothing
    ids, starts, ends = flat(rows)
    hashes, word_starts, word_ends = decoder.words(ids, starts, ends)
    for row, first, last in zip(rows, word_starts, word_ends, strict=True):
        valid = [i for i in row if 0 <= i < decoder.size]
        assert np.array_equal(hashes[first:last], word_hashes(tokenizer.decode(valid)))
    assert (word_ends - word_starts).tolist() == [7, 7 + 5, 5, 5]
    assert decoder.text(rows[0]).split() == tokenizer.decode(rows[0]).split()


def test_piece_decoder_joins_byte_level_pieces_into_whole_characters() -> None:
    pytest.importorskip("transformers")
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers
    from transformers import PreTrainedTokenizerFast

    corpus = ["The café serves naïve crème brûlée.", "日本語のテキストです。",
              "the quick brown fox jumps over the lazy dog"] * 10
    model = Tokenizer(models.BPE())
    model.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    model.decoder = decoders.ByteLevel()
    model.train_from_iterator(corpus, trainers.BpeTrainer(
        vocab_size=300, special_tokens=["<|end|>"], initial_alphabet=pre_tokenizers.ByteLevel.alphabet()))
    tokenizer = PreTrainedTokenizerFast(tokenizer_object=model, eos_token="<|end|>")
    decoder = PieceDecoder(tokenizer)
    texts = ["The café serves naïve crème brûlée, 日本語 quick fox!", "zebra über 語"]
    rows = [tokenizer.encode(t) for t in texts]
    assert any("\ufffd" in tokenizer.decode([i]) for i in rows[0])  # characters split over ids
    hashes, starts, ends = decoder.words(*flat(rows))
    for row, text, first, last in zip(rows, texts, starts, ends, strict=True):
        assert tokenizer.decode(row) == text
        assert np.array_equal(hashes[first:last], word_hashes(text))
    end = tokenizer.convert_tokens_to_ids("<|end|>")
    assert decoder.text([*rows[1], end, *rows[1]]) == f"{texts[1]} {texts[1]}"
