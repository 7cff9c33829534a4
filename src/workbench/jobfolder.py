"""`workbench init DIR`: a job folder for a user's own generation job.

The folder gets copies of the packaged, commented parameter files turned towards a real
job (the dataset manifest and the tuning sweep of a real SGLang deployment, the router's
flags, one parameter file per report pointing at the job's run) and of the report
notebooks, plus a README with the commands. To try the workbench at once it also gets the
packaged example data and tokenizer (examples/) with the demo manifest and the simulator's
sweep pointed at them (params/datasets.try.yaml, params/tuning.try.yaml), so the README's
first commands run on the simulator as they are. Run from that folder, `workbench report
NAME` uses ./notebooks/NAME.ipynb and ./params/NAME.yaml, so a team's notebooks and
parameters live in its own repository. Nothing is overwritten.
"""

from __future__ import annotations

import re
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

from workbench.errors import ConfigError
from workbench.resources import data_dir
from workbench.rundir.storage import writing

__all__ = ["JOB_RUN_DIR", "TRY_PORT", "TRY_RUN_DIR", "init_job_folder", "job_files"]

JOB_RUN_DIR = "outputs/job"
TRY_RUN_DIR = "outputs/try"
TRY_PORT = 31000

# (packaged params file, name in the job folder)
_PARAMS = (
    ("datasets.kimi-k25.yaml", "datasets.yaml"),
    ("tuning.kimi-k25.yaml", "tuning.yaml"),
    ("router.example.yaml", "router.yaml"),
    ("token_distribution.demo.yaml", "token_distribution.yaml"),
    ("format_validation.demo.yaml", "format_validation.yaml"),
    ("explore.demo.yaml", "explore.yaml"),
    ("throughput_tuning.demo.yaml", "throughput_tuning.yaml"),
    ("datasets.demo.yaml", "datasets.try.yaml"),
    ("tuning.sim.yaml", "tuning.try.yaml"),
)

# Text changes turning the packaged files towards the job folder's layout, applied in this
# order (a longer text before the shorter one it holds). A value followed by its comment
# keeps the comment's column.
_RENAMES = (
    ("outputs/tuning/kimi-k25", "outputs/tuning"),
    ("../outputs/demo/tuning", "../outputs/tuning"),
    ("the demo run (`workbench demo` writes it)", f"the job's run ({JOB_RUN_DIR})"),
    ("the demo's sweep", "the job's sweep"),
    ("(the --out of `workbench tune`); `workbench demo` writes it.",
     "(the --out of\n# `workbench tune --params params/tuning.yaml --out outputs/tuning`)."),
    ("outputs/demo", JOB_RUN_DIR),
    ("tokenizer: ../examples/tokenizer", "tokenizer: null"),
    ("datasets.kimi-k25.yaml", "datasets.yaml"),
    ("datasets.demo.yaml", "datasets.try.yaml"),
    ("tuning.kimi-k25.yaml", "tuning.yaml"),
    ("tuning.sim.yaml", "tuning.try.yaml"),
    ("token_distribution.demo.yaml", "token_distribution.yaml"),
    ("format_validation.demo.yaml", "format_validation.yaml"),
    ("explore.demo.yaml", "explore.yaml"),
    ("throughput_tuning.demo.yaml", "throughput_tuning.yaml"),
    ("outputs/kimi-k25", JOB_RUN_DIR),
)

_SERVER = f"http://127.0.0.1:{TRY_PORT}"

# The try manifest's opening comment, in place of the packaged demo manifest's.
_TRY_HEADER = f"""\
# Dataset manifest to try the workbench on the simulator: four small datasets from
# ../examples/ (copies of the workbench's example data, with a tiny tokenizer), run from the
# job folder (README.md, "Try it now on the simulator"):
#
#   workbench generate --datasets params/datasets.try.yaml \\
#       --server {_SERVER} --out {TRY_RUN_DIR}
#
# Every key is explained here; params/datasets.yaml is the same file for the real Kimi-K2.5
# job. Relative paths are relative to this file.
"""

_README = f"""# Generation job

Made by `workbench init`: commented parameter files in params/, the report notebooks in
notebooks/, and example data with a tiny tokenizer in examples/. Run every command from this
folder.

## Try it now on the simulator

The workbench's SGLang-compatible simulator stands in for a GPU server, and
params/datasets.try.yaml sends it the prompts of examples/ (well under a minute):

```bash
workbench sim --port {TRY_PORT} --enable-metrics > sim.log 2>&1 & SIM=$!   # any free port
until curl -sf {_SERVER}/health > /dev/null; do sleep 1; done   # wait (see sim.log)
workbench generate --datasets params/datasets.try.yaml --server {_SERVER} --out {TRY_RUN_DIR} \\
    --decontaminate examples/benchmarks/tiny_bench.jsonl
workbench stats {TRY_RUN_DIR}
workbench validate {TRY_RUN_DIR}
workbench report token_distribution -p run_dir={TRY_RUN_DIR}
workbench report format_validation -p run_dir={TRY_RUN_DIR} -p tokenizer=examples/tokenizer
workbench export {TRY_RUN_DIR} --to {TRY_RUN_DIR}/train.jsonl
kill $SIM                                                # stop the simulator
```

`validate` lists the replies cut at `max_new_tokens` (kept small here) among its findings, and
the prompts quoting the made-up benchmark generate was given (run.json keeps it, so validate,
the reports and `export --drop contaminated` look for it too); it exits 1 on an error only with
`--strict`. Each report prints the path of its HTML file last
(outputs/reports/NAME-latest/ links to the newest); `-p` paths are taken from this folder. Run
the generate line again and it resumes: finished samples are skipped. A server sweep on the
simulator (about three minutes; it starts its own simulators, one per configuration):

```bash
workbench tune --params params/tuning.try.yaml --out outputs/tuning/sim
workbench report throughput_tuning -p sweep_dir=outputs/tuning/sim
```

## The real job

Edit the parameter files (every key is commented), then run from this folder:

```bash
# on the GPU host: a real SGLang server (see params/tuning.yaml for the tuned flags)
python -m sglang.launch_server --model-path /models/Kimi-K2.5 --tp-size 8 \\
    --mem-fraction-static 0.88 --kv-cache-dtype bf16 --enable-hierarchical-cache --hicache-size 48 \\
    --enable-metrics --port 30000

workbench generate --datasets params/datasets.yaml --server http://gpu-host:30000 --out {JOB_RUN_DIR}
workbench monitor {JOB_RUN_DIR} --server http://gpu-host:30000
workbench report token_distribution      # uses notebooks/ and params/ of this folder
workbench report format_validation
workbench tune --params params/tuning.yaml --dry-run
```

Several servers: put `sglang-router` in front of them (params/router.yaml explains its flags).
Reports land in outputs/reports/NAME-<timestamp>/ with a NAME-latest link to the newest;
outputs/reports/index.html lists them all (open it in a browser).

## Reports on a schedule

While the job runs, keep its reports current: a check every 30 minutes renders only when the
run grew, and the loop stops once the run is finished (Ctrl-C stops it sooner):

```bash
workbench report token_distribution --every 30m --until done --keep 48
workbench report format_validation --every 1h --until done
```

Or from JupyterLab: `workbench explore {JOB_RUN_DIR}` opens Lab on this folder; right-click a
notebook of notebooks/ (or its toolbar's "Create a notebook job" button) to run it once or on a
schedule with its parameters (`run_dir` = `{JOB_RUN_DIR}`, ...). The renderings land in
outputs/reports/ and its index.html as the command line's do. A finished `workbench tune`
sweep renders its throughput_tuning report there too (`--no-report` to skip it).
"""


@dataclass(frozen=True, slots=True)
class _JobFile:
    path: Path
    data: bytes


def _renamed(text: str, renames: tuple[tuple[str, str], ...] = _RENAMES) -> str:
    for old, new in renames:
        text = re.sub(re.escape(old) + r"( +)#", _aligned(old, new), text)
        text = text.replace(old, new)
    return text


def _aligned(old: str, new: str) -> Callable[[re.Match[str]], str]:
    """new, padded so the comment after it stays in old's column (one space at least)."""
    return lambda m: new + " " * max(1, len(old) + len(m[1]) - len(new)) + "#"


def _try_manifest(packaged: str) -> str:
    """The demo manifest with the job folder's opening comment in place of its own."""
    _, body = packaged.split("\n\n", 1)
    return _TRY_HEADER + "\n" + body


def _params_text(old: str) -> str:
    text = (data_dir("params") / old).read_text(encoding="utf-8")
    if old != "datasets.demo.yaml":
        return _renamed(text)
    # the try manifest keeps its example tokenizer, copied beside params/ as in the package
    return _renamed(_try_manifest(text), tuple(r for r in _RENAMES if "tokenizer" not in r[0]))


def job_files(folder: Path) -> list[_JobFile]:
    """What `init_job_folder` writes into folder, with each file's bytes."""
    notebooks, examples = data_dir("notebooks"), data_dir("examples")
    files = [_JobFile(folder / "README.md", _README.encode())]
    files += [_JobFile(folder / "params" / new, _params_text(old).encode()) for old, new in _PARAMS]
    files += [_JobFile(folder / "notebooks" / nb.name, _renamed(nb.read_text(encoding="utf-8")).encode())
              for nb in sorted(notebooks.glob("*.ipynb"))]
    files += [_JobFile(folder / "examples" / path.relative_to(examples), path.read_bytes())
              for path in sorted(examples.rglob("*")) if path.is_file() and _carried(path, examples)]
    return files


def _carried(path: Path, root: Path) -> bool:
    """Not a cache or checkpoint file left beside the examples."""
    return not any(part.startswith(".") or part == "__pycache__" for part in path.relative_to(root).parts)


def init_job_folder(folder: str | Path) -> list[Path]:
    """Write the job folder's files; ConfigError (nothing written) when one exists already,
    StorageError naming the folder (or the file) that could not be written."""
    root = Path(folder)
    if root.exists() and not root.is_dir():
        raise ConfigError("DIR", f"{root} is a file, not a folder")
    files = job_files(root)
    existing = [str(f.path) for f in files if f.path.exists()]
    if existing:
        shown = ", ".join(existing[:3]) + (f" and {len(existing) - 3} more" if len(existing) > 3 else "")
        raise ConfigError("DIR", f"{root} already holds {shown} (nothing written; "
                                 "choose another folder or move them)")
    for f in files:
        with writing(root if not f.path.parent.is_dir() else f.path):
            f.path.parent.mkdir(parents=True, exist_ok=True)
            f.path.write_bytes(f.data)
    return [f.path for f in files]
