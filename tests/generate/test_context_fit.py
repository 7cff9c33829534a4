"""Context fit: the refusals for length parsed, the cut's arithmetic, the manifest keys, and
the runner sending a refused prompt again with fewer new tokens (mock servers and the
simulator on a real socket)."""

from __future__ import annotations

import asyncio
import json
from collections.abc import Callable
from pathlib import Path
from typing import Any

import httpx
import pytest
from conftest import jsonl, write_manifest

from workbench.analyze.validate import validate_run
from workbench.config import CONTEXT_FIT_MIN_TOKENS, load_manifest
from workbench.errors import BadRequest, ConfigError, ServerBusy
from workbench.generate.context_fit import (
    ContextRefusal,
    context_cut,
    fitted_max_new_tokens,
    parse_context_refusal,
    server_context_length,
)
from workbench.generate.plan import GenerateOptions, ServerFacts
from workbench.generate.progress import RunSummary
from workbench.generate.prompts import Prompt
from workbench.generate.session import run_generation
from workbench.server.client import SGLangClient
from workbench.server.launch import ServerProcess

# SGLang 0.5.23, tokenizer_manager._validate_one_request, word for word.
INPUT_ALONE = "The input (5916 tokens) is longer than the model's context length (4096 tokens)."
TOTAL = ("Requested token count exceeds the model's maximum context length of 4096 tokens. You "
         "requested a total of 5000 tokens: 1000 tokens from the input messages and 4000 tokens "
         "for the completion. Please reduce the number of tokens in the input messages or the "
         "completion to fit within the limit.")
SIM_CONTEXT = 32_768  # the simulator's fast profile


# --- the messages ------------------------------------------------------------------------------


def test_total_refusal_gives_context_prompt_and_completion() -> None:
    assert parse_context_refusal(TOTAL) == ContextRefusal(False, 4096, 1000, 4000)


def test_input_alone_refusal_is_marked_as_such() -> None:
    assert parse_context_refusal(INPUT_ALONE) == ContextRefusal(True, 4096, 5916)
    scheduler = ("aborted by server (BadRequestError): Input length (33000 tokens) exceeds the "
                 "maximum allowed length (32767 tokens). Use a shorter input.")
    assert parse_context_refusal(scheduler) == ContextRefusal(True, None, 33000)


@pytest.mark.parametrize("message", [
    "aborted by server (BadRequestError): " + TOTAL,  # an abort finish_reason with status 400
    TOTAL.replace("4096", "4,096").replace("5000", "5,000").replace("1000", "1,000"),
    TOTAL.upper(),
    TOTAL.replace(". You", ".\nYou"),
])
def test_total_refusal_parsed_inside_other_text(message: str) -> None:
    assert parse_context_refusal(message) == ContextRefusal(False, 4096, 1000, 4000)


def test_total_refusal_with_counts_missing() -> None:
    no_context = "Requested token count exceeds the model's maximum context length. " + TOTAL[81:]
    assert parse_context_refusal(no_context) == ContextRefusal(False, None, 1000, 4000)
    no_prompt = TOTAL.replace("1000 tokens from the input messages and ", "")
    assert parse_context_refusal(no_prompt) == ContextRefusal(False, 4096, 1000, 4000)


@pytest.mark.parametrize("message", [
    "input_ids must be in [0, 163840)", "The input is empty.", "HTTP 400", "",
    "the server refuses the unknown parameter `foo` (check the sampling parameters)",
])
def test_other_refusals_are_not_for_length(message: str) -> None:
    assert parse_context_refusal(message) is None


# --- the cut -----------------------------------------------------------------------------------


def test_cut_leaves_one_token_below_the_context() -> None:
    refusal = parse_context_refusal(TOTAL)
    assert fitted_max_new_tokens(refusal, max_new_tokens=4000, min_tokens=256) == 4096 - 1000 - 1
    assert fitted_max_new_tokens(refusal, max_new_tokens=4000, min_tokens=3095) == 3095
    assert fitted_max_new_tokens(refusal, max_new_tokens=4000, min_tokens=3096) is None


def test_no_cut_for_a_prompt_too_long_alone_or_unknown_counts() -> None:
    assert fitted_max_new_tokens(parse_context_refusal(INPUT_ALONE), max_new_tokens=4000,
                                 min_tokens=1, server_context=100_000) is None
    assert fitted_max_new_tokens(None, max_new_tokens=4000, min_tokens=1) is None
    unknown = ContextRefusal(False, None, None, 4000)
    assert fitted_max_new_tokens(unknown, max_new_tokens=4000, min_tokens=1) is None
    assert fitted_max_new_tokens(unknown, max_new_tokens=4000, min_tokens=1, sent_ids=1000) is None
    assert fitted_max_new_tokens(unknown, max_new_tokens=4000, min_tokens=1, sent_ids=1000,
                                 server_context=4096) == 3095


def test_no_cut_when_it_would_not_send_fewer_tokens() -> None:
    refusal = ContextRefusal(False, 4096, 1000, 3000)
    assert fitted_max_new_tokens(refusal, max_new_tokens=3000, min_tokens=1) is None  # 3095 >= 3000


def test_server_context_from_server_info_or_model_info() -> None:
    assert server_context_length(None) is None
    assert server_context_length(ServerFacts("u", "m", {"context_length": 8192}, {})) == 8192
    assert server_context_length(ServerFacts("u", "m", {"context_length": None},
                                             {"context_length": 4096})) == 4096
    assert server_context_length(ServerFacts("u", "m", {"context_length": True}, {})) is None


def test_context_cut_only_for_a_bad_request_of_a_reduce_generation_dataset(tmp_path: Path) -> None:
    manifest = load_manifest(manifest_file(tmp_path, fit="reduce_generation"))
    spec = manifest.datasets[0]
    prompt = Prompt(0, [7] * 1000, None, 1000)
    assert context_cut(spec, 4000, prompt, BadRequest(TOTAL, "u", 400), None) == 3095
    assert context_cut(spec, 4000, prompt, ServerBusy(TOTAL, "u", 503), None) is None
    default = load_manifest(manifest_file(tmp_path)).datasets[0]
    assert default.context_fit == "fail"
    assert context_cut(default, 4000, prompt, BadRequest(TOTAL, "u", 400), None) is None


# --- the manifest keys -------------------------------------------------------------------------


def manifest_file(folder: Path, **entry: Any) -> Path:
    """A one-dataset manifest; `fit` and `min` become context_fit and context_fit_min_tokens."""
    data = folder / "p.jsonl"
    data.write_text('{"sample_id": 0, "input_ids": [7, 8]}\n')
    lines = ["model_profile: kimi-k2.5", "datasets:", "  - name: a", f"    path: {data.name}",
             "    input: input_ids"]
    if "fit" in entry:
        lines.append(f"    context_fit: {entry['fit']}")
    if "min" in entry:
        lines.append(f"    context_fit_min_tokens: {entry['min']}")
    path = folder / "datasets.yaml"
    path.write_text("\n".join(lines) + "\n")
    return path


def test_manifest_defaults_and_values(tmp_path: Path) -> None:
    spec = load_manifest(manifest_file(tmp_path)).datasets[0]
    assert spec.context_fit == "fail" and spec.min_generation_tokens() == CONTEXT_FIT_MIN_TOKENS
    spec = load_manifest(manifest_file(tmp_path, fit="reduce_generation", min=1)).datasets[0]
    assert spec.context_fit == "reduce_generation" and spec.min_generation_tokens() == 1


@pytest.mark.parametrize(("entry", "message"), [
    ({"fit": "shrink"}, ("datasets.yaml:6: datasets[0].context_fit: invalid value 'shrink' "
                         "(expected one of: fail, reduce_generation)")),
    ({"fit": "reduce_generation", "min": 0},
     "datasets.yaml:7: datasets[0].context_fit_min_tokens: expected int >= 1, got 0"),
    ({"fit": "reduce_generation", "min": "many"},
     "datasets.yaml:7: datasets[0].context_fit_min_tokens: expected int, got str"),
    ({"min": 100}, ("datasets.yaml:6: datasets[0].context_fit_min_tokens: only applies with "
                    "context_fit: reduce_generation")),
])
def test_bad_manifest_values_name_the_key_and_line(tmp_path: Path, entry: dict[str, Any],
                                                   message: str) -> None:
    with pytest.raises(ConfigError) as caught:
        load_manifest(manifest_file(tmp_path, **entry))
    assert str(caught.value).endswith(message) and "\n" not in str(caught.value)


# --- the runner against a mock SGLang ----------------------------------------------------------


def sglang_0_5_23(context: int, info: dict[str, Any] | None = None,
                  message: Callable[[int, int], str] | None = None) -> Callable[..., Any]:
    """A /generate that refuses as SGLang's tokenizer manager does (input >= context; input +
    max_new_tokens > context: HTTP 400), and records every request's sampling params."""
    sent: list[dict[str, Any]] = []

    def refusal(prompt: int, new: int) -> str:
        return (f"Requested token count exceeds the model's maximum context length of {context} "
                f"tokens. You requested a total of {prompt + new} tokens: {prompt} tokens from "
                f"the input messages and {new} tokens for the completion. Please reduce the "
                "number of tokens in the input messages or the completion to fit within the limit.")

    async def handler(request: httpx.Request) -> httpx.Response:
        if request.url.path in ("/server_info", "/model_info"):
            return httpx.Response(200, json={"model_path": "m", **(info or {})})
        body = json.loads(request.content)
        sent.append(body)
        prompt, new = len(body["input_ids"]), body["sampling_params"]["max_new_tokens"]
        if prompt >= context:
            text = f"The input ({prompt} tokens) is longer than the model's context length ({context} tokens)."
            return httpx.Response(400, json={"error": {"message": text}})
        if prompt + new > context:
            return httpx.Response(400, json={"error": {"message": (message or refusal)(prompt, new)}})
        return httpx.Response(200, json={
            "text": "x", "output_ids": [1, 2, 3],
            "meta_info": {"id": body["rid"], "prompt_tokens": prompt, "completion_tokens": 3,
                          "cached_tokens": 0, "finish_reason": {"type": "stop", "matched": 163586},
                          "e2e_latency": 0.01}})

    handler.sent = sent  # type: ignore[attr-defined]
    return handler


def mock_manifest(tmp_path: Path, lengths: list[int], **dataset: Any) -> Path:
    data = tmp_path / "p.jsonl"
    data.write_text("".join(json.dumps({"sample_id": i, "input_ids": [7] * n}) + "\n"
                            for i, n in enumerate(lengths)))
    return write_manifest(tmp_path, [{"name": "a", "path": str(data), "input": "input_ids",
                                      **dataset}], sampling={"temperature": 0.0, "max_new_tokens": 4000})


def run_mock(tmp_path: Path, manifest: Path, handler: Callable[..., Any]) -> RunSummary:
    async def go() -> RunSummary:
        options = GenerateOptions(seed=1, backoff_base=0.001, progress_interval=60)
        async with SGLangClient("http://mock", transport=httpx.MockTransport(handler)) as client:
            return await run_generation(load_manifest(manifest), client, tmp_path / "out", options)

    return asyncio.run(go())


def test_refused_prompt_sent_again_once_with_the_cut(tmp_path: Path) -> None:
    handler = sglang_0_5_23(4096)
    manifest = mock_manifest(tmp_path, [1000, 10, 4096], context_fit="reduce_generation")
    summary = run_mock(tmp_path, manifest, handler)
    assert summary.datasets["a"].done == 2 and summary.datasets["a"].failed_samples == [2]
    asked = [(len(b["input_ids"]), b["sampling_params"]["max_new_tokens"]) for b in handler.sent]
    assert sorted(asked) == [(10, 4000), (1000, 3095), (1000, 4000), (4096, 4000)]
    records = {r["sample_id"]: r for r in jsonl(tmp_path / "out/a/raw_responses.jsonl")}
    assert records[0]["max_new_tokens_reduced"] == 3095 and list(records[0])[-1] == "max_new_tokens_reduced"
    assert "max_new_tokens_reduced" not in records[1]
    errors = jsonl(tmp_path / "out/a/errors.jsonl")
    assert sorted((e["sample_id"], e["attempt"], e["http_status"]) for e in errors) == [(0, 1, 400), (2, 1, 400)]
    run_json = json.loads((tmp_path / "out/run.json").read_text())["datasets"]["a"]
    assert (run_json["context_fit"], run_json["context_fit_min_tokens"]) == ("reduce_generation", 256)


def test_cut_that_is_refused_again_fails_without_a_third_try(tmp_path: Path) -> None:
    handler = sglang_0_5_23(4096, message=lambda p, n: (
        f"Requested token count exceeds the model's maximum context length of 4500 tokens. You "
        f"requested a total of {p + n} tokens: {p} tokens from the input messages and {n} tokens "
        "for the completion."))  # a context the server does not keep: the cut is refused too
    manifest = mock_manifest(tmp_path, [1000], context_fit="reduce_generation")
    summary = run_mock(tmp_path, manifest, handler)
    assert summary.datasets["a"].failed_samples == [0]
    assert [b["sampling_params"]["max_new_tokens"] for b in handler.sent] == [4000, 3499]
    assert [e["attempt"] for e in jsonl(tmp_path / "out/a/errors.jsonl")] == [1, 2]


def test_context_from_server_info_when_the_message_has_none(tmp_path: Path) -> None:
    handler = sglang_0_5_23(4096, info={"context_length": 4096}, message=lambda p, n: (
        f"Requested token count exceeds the model's maximum context length. You requested a "
        f"total of {p + n} tokens: {p} tokens from the input messages and {n} tokens for the "
        "completion."))
    manifest = mock_manifest(tmp_path, [1000], context_fit="reduce_generation")
    assert run_mock(tmp_path, manifest, handler).datasets["a"].done == 1
    assert [b["sampling_params"]["max_new_tokens"] for b in handler.sent] == [4000, 3095]


def test_fail_is_the_default(tmp_path: Path) -> None:
    handler = sglang_0_5_23(4096)
    summary = run_mock(tmp_path, mock_manifest(tmp_path, [1000]), handler)
    assert summary.datasets["a"].failed_samples == [0] and len(handler.sent) == 1
    assert not (tmp_path / "out/a/raw_responses.jsonl").read_text()


# --- the runner against the simulator ----------------------------------------------------------


@pytest.mark.integration
def test_simulator_refusal_cut_to_fit(tmp_path: Path, shared_sim: ServerProcess) -> None:
    """Prompt + max_new_tokens over the simulator's context: `fit` sends it again cut, `fail`
    and `min` (a minimum above what fits) fail it; a prompt too long alone always fails."""
    server = shared_sim
    short, alone = tmp_path / "short.jsonl", tmp_path / "alone.jsonl"
    short.write_text(json.dumps({"sample_id": 0, "input_ids": [7] * 200}) + "\n")
    alone.write_text(short.read_text() + json.dumps({"sample_id": 1, "input_ids": [7] * 33_000}) + "\n")
    fitted = SIM_CONTEXT - 200 - 1
    manifest = load_manifest(write_manifest(tmp_path, [
        {"name": "fit", "path": str(alone), "input": "input_ids", "context_fit": "reduce_generation"},
        {"name": "fail", "path": str(short), "input": "input_ids"},
        {"name": "min", "path": str(short), "input": "input_ids", "context_fit": "reduce_generation",
         "context_fit_min_tokens": fitted + 1},
    ], sampling={"temperature": 0.0, "max_new_tokens": 32_600}))
    out = tmp_path / "out"

    async def go() -> RunSummary:
        async with SGLangClient(server.url) as client:
            options = GenerateOptions(seed=1, progress_interval=60, backoff_base=0.01)
            return await run_generation(manifest, client, out, options)

    summary = asyncio.run(go())
    done = {name: (p.done, p.failed_samples) for name, p in summary.datasets.items()}
    assert done == {"fit": (1, [1]), "fail": (0, [0]), "min": (0, [0])}
    [record] = jsonl(out / "fit/raw_responses.jsonl")
    assert record["max_new_tokens_reduced"] == fitted
    assert record["prompt_tokens"] == 200 and 0 < record["completion_tokens"] <= fitted
    errors = sorted((e["sample_id"], e["attempt"], e["http_status"], e["error_type"])
                    for e in jsonl(out / "fit/errors.jsonl"))
    assert errors == [(0, 1, 400, "bad_request"), (1, 1, 400, "bad_request")]
    refusal = next(e["message"] for e in jsonl(out / "fit/errors.jsonl") if e["sample_id"] == 0)
    assert f"maximum context length of {SIM_CONTEXT} tokens" in refusal
    for name in ("fail", "min"):
        assert not (out / name / "raw_responses.jsonl").read_text()
        assert [e["attempt"] for e in jsonl(out / name / "errors.jsonl")] == [1]
    findings = {f.rule: f for f in validate_run(out, workers=1).datasets["fit"].findings}
    assert findings["context_reduced"].severity == "info" and findings["context_reduced"].count == 1
    assert findings["context_reduced"].examples[0].detail == (
        f"sample_id 0: max_new_tokens cut to {fitted} to fit the context")
    assert "prompt_tokens_mismatch" not in findings
