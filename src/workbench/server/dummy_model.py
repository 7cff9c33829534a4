"""A model folder SGLang can serve with random weights: a Llama `config.json` and a tokenizer.

SGLang's `--load-format dummy` builds the model from its `config.json` and fills the weights
with random values, so a folder holding only a config and a tokenizer is enough for a real
server: the real scheduler, radix cache, HTTP API and metrics, with nothing downloaded.
The default is tiny (2 layers, hidden 256) so that it runs on a CPU; the vocabulary covers
the tokenizer's ids. Replies are random tokens, so nearly every reply runs to
`max_new_tokens` (the end id is one token in 163,840).

    python -m workbench.server.dummy_model OUT_DIR [--layers 2] [--hidden 256] [--context 4096]

A GPU host can pass a real size (e.g. `--layers 32 --hidden 4096 --heads 32 --kv-heads 8
--intermediate 14336`) to measure a dense 8B model's scheduler without its weights.
"""

from __future__ import annotations

import argparse
import json
import shutil
import sys
from pathlib import Path

from workbench.errors import InputError, WorkbenchError
from workbench.resources import data_dir
from workbench.rundir.files import write_atomic

__all__ = ["TOKENIZER_FILES", "llama_config", "write_dummy_model"]

TOKENIZER_FILES = ("tokenizer.json", "tokenizer_config.json")


def llama_config(
    *,
    layers: int = 2,
    hidden: int = 256,
    heads: int = 4,
    kv_heads: int = 2,
    intermediate: int | None = None,
    context: int = 4096,
    vocab_size: int = 163_840,
) -> dict[str, object]:
    """A Llama `config.json` of the given size."""
    if hidden % heads:
        raise InputError(f"hidden size {hidden} is not a multiple of {heads} heads")
    if heads % kv_heads:
        raise InputError(f"{heads} heads are not a multiple of {kv_heads} KV heads")
    return {
        "architectures": ["LlamaForCausalLM"],
        "model_type": "llama",
        "hidden_size": hidden,
        "intermediate_size": intermediate or 2 * hidden,
        "num_hidden_layers": layers,
        "num_attention_heads": heads,
        "num_key_value_heads": kv_heads,
        "head_dim": hidden // heads,
        "vocab_size": vocab_size,
        "max_position_embeddings": context,
        "rms_norm_eps": 1e-5,
        "rope_theta": 10000.0,
        "hidden_act": "silu",
        "torch_dtype": "bfloat16",
        "tie_word_embeddings": False,
        "bos_token_id": 0,
        "eos_token_id": 1,
    }


def _tokenizer_vocab(folder: Path) -> int:
    """Ids the tokenizer can produce (its largest id + 1)."""
    data = json.loads((folder / "tokenizer.json").read_text(encoding="utf-8"))
    ids = list(data["model"]["vocab"].values()) + [t["id"] for t in data.get("added_tokens", [])]
    return max(ids) + 1


def write_dummy_model(out: Path, **size: int) -> Path:
    """Write `config.json` and the example tokenizer into `out`; returns `out`."""
    tokenizer = data_dir("examples") / "tokenizer"
    config = llama_config(**size)
    needed = _tokenizer_vocab(tokenizer)
    if int(config["vocab_size"]) < needed:  # type: ignore[call-overload]
        raise InputError(f"vocab_size {config['vocab_size']} is smaller than the tokenizer's "
                         f"{needed} ids")
    try:
        out.mkdir(parents=True, exist_ok=True)
        for name in TOKENIZER_FILES:
            shutil.copyfile(tokenizer / name, out / name)
        write_atomic(out / "config.json", (json.dumps(config, indent=2) + "\n").encode())
    except OSError as exc:
        raise InputError(f"{out}: cannot write the model folder: {exc.strerror or exc}") from None
    return out


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        prog="python -m workbench.server.dummy_model",
        description="Write a model folder for SGLang's --load-format dummy (random weights).")
    parser.add_argument("out", type=Path, help="the model folder (created when missing)")
    parser.add_argument("--layers", type=int, default=2)
    parser.add_argument("--hidden", type=int, default=256)
    parser.add_argument("--heads", type=int, default=4)
    parser.add_argument("--kv-heads", type=int, default=2)
    parser.add_argument("--intermediate", type=int, default=None)
    parser.add_argument("--context", type=int, default=4096, help="max_position_embeddings")
    args = parser.parse_args(argv)
    try:
        out = write_dummy_model(args.out, layers=args.layers, hidden=args.hidden, heads=args.heads,
                                kv_heads=args.kv_heads, intermediate=args.intermediate or 0,
                                context=args.context)
    except WorkbenchError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 2
    print(f"wrote {out}/config.json (serve it with --load-format dummy)")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
