"""The fidelity probe's measures on hand-made reply pairs."""

from __future__ import annotations

import pytest

from workbench.tune.fidelity import ProbeReply, compare, drift, verdict


def test_identical_replies() -> None:
    pair = compare(ProbeReply([1, 2, 3], [-0.1, -0.2, -0.3]),
                   ProbeReply([1, 2, 3], [-0.1, -0.25, -0.3]))
    assert pair.identical and pair.first_divergence is None and pair.agreement == 1.0
    assert pair.logprob_diff == pytest.approx(0.05 / 3)  # over all three positions


def test_a_flipped_token_and_what_follows() -> None:
    pair = compare(ProbeReply([1, 2, 3, 4, 5], [-1.0, -1.0, -1.0, -1.0, -1.0]),
                   ProbeReply([1, 2, 9, 4, 6, 7], [-1.5, -0.5, -2.0, -1.0, -1.0, -1.0]))
    assert not pair.identical and pair.first_divergence == 2
    assert pair.agreement == pytest.approx(3 / 6)  # positions 0, 1, 3 of the longer six
    assert pair.logprob_diff == pytest.approx(0.5)  # positions 0 and 1 only


def test_a_reply_that_stops_early_diverges_where_it_ends() -> None:
    pair = compare(ProbeReply([1, 2, 3, 4]), ProbeReply([1, 2]))
    assert pair.first_divergence == 2 and pair.agreement == 0.5 and pair.logprob_diff is None
    assert compare(ProbeReply([]), ProbeReply([])).identical
    assert compare(ProbeReply([], []), ProbeReply([5], [-1.0])).logprob_diff is None


def test_drift_sums_the_pairs_and_leaves_out_unanswered_prompts() -> None:
    base = {"a": ProbeReply([1, 2, 3, 4]), "b": ProbeReply([5, 6, 7, 8]),
            "c": ProbeReply([1, 1, 1, 1]), "gone": ProbeReply([1])}
    other = {"a": ProbeReply([1, 2, 3, 4]), "b": ProbeReply([5, 0, 7, 8]),
             "c": ProbeReply([1, 1, 1, 1, 1, 1, 1, 1])}
    d = drift(base, other)
    assert d.replies == 3 and d.identical_share == pytest.approx(1 / 3)
    assert d.mean_first_divergence == pytest.approx((1 + 4) / 2)
    assert d.agreement == pytest.approx((1 + 0.75 + 0.5) / 3)
    assert d.differing_share == pytest.approx(2 / 3)
    with pytest.raises(ValueError, match="no probe prompt was answered by both"):
        drift(base, {"x": ProbeReply([1])})


def test_verdict_against_the_noise_floor() -> None:
    replies = {str(i): ProbeReply([i, i]) for i in range(50)}
    flipped = {k: ProbeReply([r.output_ids[0], -1]) if int(k) < 19 else r
               for k, r in replies.items()}  # 19 of 50 differ: 38%
    noisy = {k: ProbeReply([r.output_ids[0], -1]) if int(k) < 1 else r
             for k, r in replies.items()}  # 1 of 50: 2%
    measured = drift(replies, flipped).differing_share
    floor = drift(replies, noisy).differing_share
    assert verdict("fp8_e4m3", measured, floor, 0.05, baseline="bf16", speedup=1.31,
                   max_new_tokens=400) == (
        "fp8_e4m3: 1.31x faster, 38% of replies differ from bf16 before token 400 "
        "(noise floor 2%): excluded")
    assert verdict("cps512", floor, floor, 0.05, baseline="bf16") is None
    assert verdict("x", measured, None, 0.5, baseline="bf16") is None  # 38% - 0 <= 50%
    assert verdict("x", measured, None, 0.3, baseline="b") == (
        "x: 38% of replies differ from b (noise floor 0%): excluded")
    assert verdict("x", measured, 0.0, 0.05, baseline="b", speedup=0.77).startswith(
        "x: 0.77x as fast, 38% of replies")
