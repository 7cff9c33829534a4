"""Near-duplicate detection on synthetic replies: recall of planted copies, false positives, speed.

    python bench/dedup.py [--rows 20000] [--planted 1000] [--seed 0] [--repeat 3]
                          [--shingle N] [--num-perm N] [--threshold X] [--boilerplate 0.3]
                          [--sweep] [--scale-rows 100000] [--prompts 20000]

Replies of 300-3,000 ids drawn from a Zipf-ish vocabulary (weight 1 / (rank + 2.7) ** 1.1 over
163,840 ids), and `--planted` copies of distinct replies with 5-10% of their ids changed
(substitutions, insertions and deletions alike), shuffled in among them. `--boilerplate`
(default 0.3) of every reply is overwritten by stock phrases shared by all replies, so that
unrelated replies share shingles as real ones do. With the module's defaults (or the options),
figures: the recall of the planted pairs (the copy's earliest near duplicate is its source),
the share of unrelated replies flagged, the time of `signatures` + `near_duplicates` per 1M ids
against a plain `np.unique` (and `np.sort`) over the same ids in this process; the cost of
`repeat_share`, `digest` and `signatures` over blocks of ~37k ids (what the scan hands over
from a 256 KB block) against the same np.unique; and `near_duplicates` alone on `--scale-rows`
rows. `--sweep` also prints recall and false positives over a grid of shingle, num_perm and
threshold.
Targets: recall >= 0.95 and false positives <= 1% at the defaults; near_duplicates on 100k
rows well under a second.

Prompts (`--prompts N`, 0 to skip): N questions of 40-80 words (word hashes, the same
vocabulary) under one shared template of 300 words (250 before the question, as a system
prompt with tool schemas, 50 after, as a chat template's end), 5% of them planted copies of
earlier questions with one to three words changed at random places; and N prompts of 60
words with no template, 5% copies with one word changed. Each compared as before (whole
prompts, threshold 0.9) and as now (the dataset's template left out,
`workbench.sketch.template_shingles` over the first 1,000, threshold PROMPT_THRESHOLD): the
recall of the planted copies and the share of distinct prompts flagged, and the time of the
template and the signatures against whole-prompt signatures. Targets: recall >= 0.95 in
both, distinct prompts flagged <= 1%.
"""

from __future__ import annotations

import argparse
import itertools
import time
from collections.abc import Callable

import numpy as np

from workbench.analyze.quality import SIGNATURE_DTYPE
from workbench.sketch import (
    DEFAULT_NUM_PERM,
    DEFAULT_SHINGLE,
    DEFAULT_THRESHOLD,
    PROMPT_THRESHOLD,
    TEMPLATE_ROWS,
    digest,
    near_duplicates,
    repeat_share,
    signatures,
    template_shingles,
)

VOCAB = 163_840
RECALL_TARGET = 0.95
FALSE_POSITIVE_TARGET = 0.01


class Replies:
    """Rows back to back (ids, starts, ends) and the planted (earlier, later) pairs."""

    def __init__(self, rows: list[np.ndarray], pairs: np.ndarray) -> None:
        lengths = np.array([len(r) for r in rows], dtype=np.int64)
        self.ends = np.cumsum(lengths)
        self.starts = self.ends - lengths
        self.ids = np.concatenate(rows).astype(np.int64)
        self.pairs = pairs

    def __len__(self) -> int:
        return len(self.starts)


def vocabulary(rng: np.random.Generator) -> tuple[np.ndarray, np.ndarray]:
    """(ids by rank, cumulative weights) of the Zipf-ish vocabulary."""
    weights = 1.0 / (np.arange(VOCAB) + 2.7) ** 1.1
    return rng.permutation(VOCAB), np.cumsum(weights / weights.sum())


def draw(rng: np.random.Generator, vocab: tuple[np.ndarray, np.ndarray], count: int) -> np.ndarray:
    ranks = np.minimum(np.searchsorted(vocab[1], rng.random(count)), VOCAB - 1)
    return vocab[0][ranks]


def edited(rng: np.random.Generator, vocab: tuple[np.ndarray, np.ndarray], row: np.ndarray) -> np.ndarray:
    """row with 5-10% of its ids changed: substituted, followed by an insertion, or deleted."""
    share = rng.uniform(0.05, 0.10)
    kind = np.where(rng.random(len(row)) < share, rng.integers(1, 4, len(row)), 0)
    out = row.copy()
    out[kind == 1] = draw(rng, vocab, int((kind == 1).sum()))
    keep = kind != 3
    extra = kind == 2  # an insertion after this id
    repeat = keep.astype(np.int64) + extra
    result = np.repeat(out, repeat)
    inserted_at = np.cumsum(repeat)[extra] - 1
    result[inserted_at] = draw(rng, vocab, len(inserted_at))
    return result


def with_boilerplate(rng: np.random.Generator, vocab: tuple[np.ndarray, np.ndarray],
                     flat: np.ndarray, share: float) -> np.ndarray:
    """flat with about `share` of it overwritten by stock phrases: 1,000 phrases of 3-15 ids,
    the k-th used with weight 1 / (k + 1), as replies reuse the same formulas."""
    if share <= 0:
        return flat
    lengths = rng.integers(3, 16, 1000)
    pool = draw(rng, vocab, int(lengths.sum()))
    offsets = np.cumsum(lengths) - lengths
    weights = np.cumsum(1.0 / np.arange(1, 1001))
    count = int(share * len(flat) / lengths.mean())
    phrase = np.minimum(np.searchsorted(weights / weights[-1], rng.random(count)), 999)
    size = lengths[phrase]
    within = np.arange(int(size.sum())) - np.repeat(np.cumsum(size) - size, size)
    at = np.repeat(rng.integers(0, len(flat), count), size) + within
    inside = at < len(flat)
    out = flat.copy()
    out[at[inside]] = pool[(np.repeat(offsets[phrase], size) + within)[inside]]
    return out


def make_replies(rows: int, planted: int, seed: int, shortest: int = 300,
                 longest: int = 3000, boilerplate: float = 0.0) -> Replies:
    """`rows` unrelated replies and `planted` edited copies of distinct ones, shuffled."""
    rng = np.random.default_rng(seed)
    vocab = vocabulary(rng)
    lengths = rng.integers(shortest, longest + 1, rows)
    flat = with_boilerplate(rng, vocab, draw(rng, vocab, int(lengths.sum())), boilerplate)
    originals = np.split(flat, np.cumsum(lengths)[:-1])
    sources = rng.choice(rows, planted, replace=False)
    copies = [edited(rng, vocab, originals[s]) for s in sources]
    order = rng.permutation(rows + planted)  # order[k]: the position of item k
    position_of = np.empty(rows + planted, dtype=np.int64)
    position_of[order] = np.arange(rows + planted)
    items = originals + copies
    by_position: list[np.ndarray] = [items[k] for k in np.argsort(position_of)]
    copy_at = position_of[rows + np.arange(planted)]
    source_at = position_of[sources]
    pairs = np.sort(np.stack([source_at, copy_at], axis=1), axis=1)
    return Replies(by_position, pairs)


def scores(replies: Replies, partner: np.ndarray) -> tuple[float, float]:
    """(recall of the planted pairs, share of unrelated rows flagged)."""
    earlier, later = replies.pairs[:, 0], replies.pairs[:, 1]
    recall = float(np.mean(partner[later] == earlier))
    related = np.zeros(len(replies), dtype=bool)
    related[replies.pairs.ravel()] = True
    false_positive = float(np.mean(partner[~related] >= 0))
    return recall, false_positive


def best(action: Callable[[], object], repeat: int) -> float:
    times = []
    for _ in range(repeat):
        start = time.perf_counter()
        action()
        times.append(time.perf_counter() - start)
    return min(times)


def blocks(replies: Replies, ids_per_block: int = 37_000) -> list[tuple[np.ndarray, np.ndarray,
                                                                         np.ndarray]]:
    """The replies cut into blocks of whole rows of about ids_per_block ids (a 256 KB block of
    the scan holds about 37k ids), each in the scan's layout."""
    cuts = np.searchsorted(replies.ends, np.arange(ids_per_block, replies.ends[-1], ids_per_block))
    bounds = [0, *sorted(set(cuts.tolist()) - {0, len(replies)}), len(replies)]
    out = []
    for a, b in itertools.pairwise(bounds):
        base = replies.starts[a]
        out.append((replies.ids[base:replies.ends[b - 1]], replies.starts[a:b] - base,
                    replies.ends[a:b] - base))
    return out


def per_block(replies: Replies, shingle: int, num_perm: int, repeat: int, unique: float) -> None:
    """Each per-row function over the scan's blocks, ms per 1M ids and against np.unique."""
    parts = blocks(replies)
    million = len(replies.ids) / 1e6
    print(f"\nper block of ~37k ids ({len(parts):,} blocks), ms per 1M ids, ratio to np.unique:")
    work: dict[str, Callable[[np.ndarray, np.ndarray, np.ndarray], object]] = {
        "repeat_share (n=10)": repeat_share,
        "digest": digest,
        "signatures": lambda i, s, e: signatures(i, s, e, shingle, num_perm),
        "np.unique per block": lambda i, s, e: np.unique(i),
    }
    for label, action in work.items():
        def every_block(action: Callable[..., object] = action) -> None:
            for part in parts:
                action(*part)

        took = best(every_block, repeat) / million
        print(f"  {label:<24} {took * 1000:7.1f}   {took / unique:5.2f}")


def kept(sigs: np.ndarray) -> np.ndarray:
    """Signatures as validate keeps them in its cache (SIGNATURE_DTYPE values)."""
    return sigs.astype(SIGNATURE_DTYPE)


def sweep(replies: Replies) -> None:
    print("\nshingle num_perm threshold  recall  false+")
    for shingle in (2, 3, 4, 5):
        for num_perm in (64, 128):
            sigs = kept(signatures(replies.ids, replies.starts, replies.ends, shingle, num_perm))
            for threshold in (0.3, 0.4, 0.5, 0.6, 0.7, 0.8):
                recall, false_positive = scores(replies, near_duplicates(sigs, threshold))
                print(f"{shingle:7d} {num_perm:8d} {threshold:9.2f} {recall:7.3f} {false_positive:7.3%}")


def scale(rows: int, shingle: int, num_perm: int, threshold: float, repeat: int,
          boilerplate: float) -> None:
    """near_duplicates alone on `rows` signatures of short replies (1% planted copies)."""
    replies = make_replies(rows - rows // 100, rows // 100, seed=1, shortest=50, longest=400,
                           boilerplate=boilerplate)
    sigs = kept(signatures(replies.ids, replies.starts, replies.ends, shingle, num_perm))
    took = best(lambda: near_duplicates(sigs, threshold), repeat)
    recall, false_positive = scores(replies, near_duplicates(sigs, threshold))
    print(f"near_duplicates on {rows:,} rows of 50-400 ids: {took * 1000:7.1f} ms "
          f"(recall {recall:.3f}, unrelated flagged {false_positive:.3%})")


OLD_PROMPT_THRESHOLD = 0.9  # whole prompts compared, before templates were left out


def make_prompts(count: int, seed: int, template: int, shortest: int, longest: int,
                 changes: tuple[int, int]) -> Replies:
    """`count` prompts, 5% of them copies of earlier questions with `changes` words changed
    (distinct places), each question between the first 250 and the rest of a shared template
    of `template` words (none when 0)."""
    rng = np.random.default_rng(seed)
    vocab = vocabulary(rng)
    planted = count // 20
    questions = [draw(rng, vocab, int(n)) for n in rng.integers(shortest, longest + 1, count - planted)]
    sources = np.sort(rng.choice(len(questions), planted, replace=False))
    for source in sources:
        copy = questions[source].copy()
        where = rng.choice(len(copy), int(rng.integers(changes[0], changes[1] + 1)), replace=False)
        copy[where] = draw(rng, vocab, len(where))
        questions.append(copy)
    shared = draw(rng, vocab, template)
    head, tail = shared[:min(250, template)], shared[min(250, template):]
    rows = [np.concatenate([head, q, tail]) for q in questions]
    pairs = np.stack([sources, len(questions) - planted + np.arange(planted)], axis=1)
    return Replies(rows, pairs)


def prompt_figures(prompts: Replies, whole: bool, threshold: float) -> tuple[np.ndarray, float]:
    """(partner of each prompt, seconds): compared whole, or without the template of the
    first TEMPLATE_ROWS, at `threshold`."""
    start = time.perf_counter()
    if whole:
        sigs = kept(signatures(prompts.ids, prompts.starts, prompts.ends))
    else:
        first = min(TEMPLATE_ROWS, len(prompts))
        template = template_shingles(prompts.ids, prompts.starts[:first], prompts.ends[:first])
        sigs = kept(signatures(prompts.ids, prompts.starts, prompts.ends, exclude=template.shingles))
    took = time.perf_counter() - start
    return near_duplicates(sigs, threshold), took


def prompt_bench(count: int, seed: int, repeat: int) -> bool:
    """The prompts' figures (module docstring); whether the targets are met."""
    cases = {"under a 300-word template, 40-80 words, 1-3 changed":
             make_prompts(count, seed, 300, 40, 80, (1, 3)),
             "no template, 60 words, 1 changed": make_prompts(count, seed + 1, 0, 60, 60, (1, 1))}
    print(f"\nprompts ({count:,} each, 5% planted copies): recall / distinct flagged / time")
    met = True
    variants = {f"whole prompts at {OLD_PROMPT_THRESHOLD}": (True, OLD_PROMPT_THRESHOLD),
                f"whole prompts at {PROMPT_THRESHOLD}": (True, PROMPT_THRESHOLD),
                f"without the template at {PROMPT_THRESHOLD}": (False, PROMPT_THRESHOLD)}
    for label, prompts in cases.items():
        print(f"  {label}")
        baseline = None
        for name, (whole, threshold) in variants.items():
            partner, _ = prompt_figures(prompts, whole, threshold)
            took = best(lambda w=whole, t=threshold, p=prompts: prompt_figures(p, w, t), repeat)
            baseline = baseline or took
            recall, false = scores(prompts, partner)
            print(f"    {name:<30} recall {recall:6.3f}  flagged {false:7.3%}  "
                  f"{took * 1000:7.1f} ms ({took / baseline:.2f}x)")
        met = met and recall >= RECALL_TARGET and false <= FALSE_POSITIVE_TARGET
    print(f"prompt targets: {'met' if met else 'MISSED'}")
    return met


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rows", type=int, default=20_000)
    parser.add_argument("--planted", type=int, default=1_000)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--repeat", type=int, default=3)
    parser.add_argument("--shingle", type=int, default=DEFAULT_SHINGLE)
    parser.add_argument("--num-perm", type=int, default=DEFAULT_NUM_PERM)
    parser.add_argument("--threshold", type=float, default=DEFAULT_THRESHOLD)
    parser.add_argument("--boilerplate", type=float, default=0.3)
    parser.add_argument("--sweep", action="store_true")
    parser.add_argument("--scale-rows", type=int, default=100_000)
    parser.add_argument("--prompts", type=int, default=20_000)
    args = parser.parse_args()
    if args.prompts:
        prompt_bench(args.prompts, args.seed, args.repeat)
    replies = make_replies(args.rows, args.planted, args.seed, boilerplate=args.boilerplate)
    million = len(replies.ids) / 1e6
    print(f"{len(replies):,} replies, {len(replies.ids):,} ids, {args.planted:,} planted copies; "
          f"shingle {args.shingle}, num_perm {args.num_perm}, threshold {args.threshold}")
    holder: dict[str, np.ndarray] = {}

    def sign() -> None:
        holder["sigs"] = kept(signatures(replies.ids, replies.starts, replies.ends, args.shingle,
                                         args.num_perm))

    signing = best(sign, args.repeat)
    finding = best(lambda: holder.__setitem__("partner", near_duplicates(holder["sigs"],
                                                                         args.threshold)),
                   args.repeat)
    unique = best(lambda: np.unique(replies.ids), args.repeat)
    ordering = best(lambda: np.sort(replies.ids), args.repeat)
    recall, false_positive = scores(replies, holder["partner"])
    ours = (signing + finding) / million
    print(f"recall of planted pairs    {recall:7.3f}   (target >= {RECALL_TARGET})")
    print(f"unrelated rows flagged     {false_positive:7.3%}   (target <= {FALSE_POSITIVE_TARGET:.0%})")
    print(f"signatures                 {signing / million * 1000:7.1f} ms per 1M ids")
    print(f"near_duplicates            {finding * 1000:7.1f} ms for {len(replies):,} rows")
    print(f"signatures + near_dups     {ours * 1000:7.1f} ms per 1M ids")
    print(f"np.unique over the ids     {unique / million * 1000:7.1f} ms per 1M ids   "
          f"ratio {ours / (unique / million):.2f}")
    print(f"np.sort over the ids       {ordering / million * 1000:7.1f} ms per 1M ids   "
          f"ratio {ours / (ordering / million):.2f}")
    verdict = recall >= RECALL_TARGET and false_positive <= FALSE_POSITIVE_TARGET
    print(f"targets: {'met' if verdict else 'MISSED'}")
    per_block(replies, args.shingle, args.num_perm, args.repeat, unique / million)
    if args.scale_rows:
        scale(args.scale_rows, args.shingle, args.num_perm, args.threshold, args.repeat,
              args.boilerplate)
    if args.sweep:
        sweep(replies)


if __name__ == "__main__":
    main()
