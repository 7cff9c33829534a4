"""The model folder SGLang serves with --load-format dummy."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from workbench.errors import InputError
from workbench.server.dummy_model import llama_config, main, write_dummy_model


def test_the_folder_holds_a_llama_config_covering_the_tokenizer(tmp_path: Path) -> None:
    out = write_dummy_model(tmp_path / "model")
    config = json.loads((out / "config.json").read_text())
    assert config["architectures"] == ["LlamaForCausalLM"]
    assert (config["num_hidden_layers"], config["hidden_size"], config["head_dim"]) == (2, 256, 64)
    tokenizer = json.loads((out / "tokenizer.json").read_text())
    ids = [*tokenizer["model"]["vocab"].values(), *(t["id"] for t in tokenizer["added_tokens"])]
    assert config["vocab_size"] > max(ids)  # the think-end and end ids are 163,8xx
    assert json.loads((out / "tokenizer_config.json").read_text())["chat_template"]


def test_sizes_that_cannot_work_are_refused(tmp_path: Path) -> None:
    with pytest.raises(InputError, match="not a multiple of 3 heads"):
        llama_config(hidden=256, heads=3)
    with pytest.raises(InputError, match="smaller than the tokenizer's 163840 ids"):
        write_dummy_model(tmp_path / "m", vocab_size=32_000)
    assert not (tmp_path / "m").exists()


def test_the_command_writes_the_folder_and_names_an_unwritable_one(
        tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    assert main([str(tmp_path / "m"), "--layers", "4", "--context", "8192"]) == 0
    config = json.loads((tmp_path / "m" / "config.json").read_text())
    assert (config["num_hidden_layers"], config["max_position_embeddings"]) == (4, 8192)
    blocker = tmp_path / "file"
    blocker.write_text("x")
    assert main([str(blocker / "m")]) == 2
    assert capsys.readouterr().err.startswith(f"error: {blocker / 'm'}: cannot write the model folder")
