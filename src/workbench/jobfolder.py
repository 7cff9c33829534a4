"""`workbench init DIR`: a job folder for a user's own generation job.

The folder gets copies of the packaged, commented parameter files turned towards a real
job (the dataset manifest and the tuning sweep of a real SGLang deployment, the router's
flags, one parameter file per report pointing at the job's run) and of the report
notebooks, plus a README with the commands. Run from that folder, `workbench report NAME`
uses ./notebooks/NAME.ipynb and ./params/NAME.yaml, so a team's notebooks and parameters
live in its own repository. Nothing is overwritten.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

from workbench.errors import ConfigError
from workbench.resources import data_dir

__all__ = ["JOB_RUN_DIR", "init_job_folder", "job_files"]

JOB_RUN_DIR = "outputs/job"

# (packaged params file, name in the job folder)
_PARAMS = (
    ("datasets.kimi-k25.yaml", "datasets.yaml"),
    ("tuning.kimi-k25.yaml", "tuning.yaml"),
    ("router.example.yaml", "router.yaml"),
    ("token_distribution.demo.yaml", "token_distribution.yaml"),
    ("format_validation.demo.yaml", "format_validation.yaml"),
    ("explore.demo.yaml", "explore.yaml"),
    ("throughput_tuning.demo.yaml", "throughput_tuning.yaml"),
)

# Text changes turning the packaged files towards the job folder's layout (longest first).
_RENAMES = (
    ("outputs/tuning/kimi-k25", "outputs/tuning"),
    ("../outputs/demo/tuning", "../outputs/tuning"),
    ("../outputs/demo", f"../{JOB_RUN_DIR}"),
    ("tokenizer: ../examples/tokenizer", "tokenizer: null"),
    ("params/datasets.kimi-k25.yaml", "params/datasets.yaml"),
    ("datasets.kimi-k25.yaml", "datasets.yaml"),
    ("params/tuning.kimi-k25.yaml", "params/tuning.yaml"),
    ("outputs/kimi-k25", JOB_RUN_DIR),
)

_README = f"""# Generation job

Made by `workbench init`. Edit the parameter files (every key is commented), then run from
this folder:

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
Reports land in outputs/reports/NAME-<timestamp>/ with a NAME-latest link to the newest.
"""


@dataclass(frozen=True, slots=True)
class _JobFile:
    path: Path
    text: str


def _renamed(text: str) -> str:
    for old, new in _RENAMES:
        text = text.replace(old, new)
    return text


def job_files(folder: Path) -> list[_JobFile]:
    """What `init_job_folder` writes into folder, with each file's text."""
    params, notebooks = data_dir("params"), data_dir("notebooks")
    files = [_JobFile(folder / "README.md", _README)]
    files += [_JobFile(folder / "params" / new, _renamed((params / old).read_text(encoding="utf-8")))
              for old, new in _PARAMS]
    files += [_JobFile(folder / "notebooks" / nb.name, nb.read_text(encoding="utf-8"))
              for nb in sorted(notebooks.glob("*.ipynb"))]
    return files


def init_job_folder(folder: str | Path) -> list[Path]:
    """Write the job folder's files; ConfigError (nothing written) when one exists already."""
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
        f.path.parent.mkdir(parents=True, exist_ok=True)
        f.path.write_text(f.text, encoding="utf-8")
    return [f.path for f in files]
