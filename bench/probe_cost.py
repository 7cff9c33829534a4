"""What the fidelity probe adds to a tuning sweep: params/tuning.sim.yaml on the simulator, once
with the probe off (`fidelity.prompts=0`, the baseline) and once with its default size, in this
process; prints both wall times and the ratio. Target: the probe adds at most 10%.

    .venv/bin/python bench/probe_cost.py [--params params/tuning.sim.yaml] [--set KEY=VALUE ...]
"""

from __future__ import annotations

import argparse
import tempfile
import time
from pathlib import Path

from workbench.tune import load_tuning_params, run_sweep

ROOT = Path(__file__).resolve().parent.parent


def timed_sweep(params_file: Path, overrides: list[str], out: Path) -> float:
    params = load_tuning_params(params_file, overrides)
    started = time.perf_counter()
    summary = run_sweep(params, out)
    seconds = time.perf_counter() - started
    print(f"  {len(summary.results)} points ({summary.failed} failed) in {seconds:.1f} s "
          f"[{' '.join(overrides) or 'as the file says'}]", flush=True)
    return seconds


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--params", type=Path, default=ROOT / "params" / "tuning.sim.yaml")
    parser.add_argument("--set", action="append", default=[], metavar="KEY=VALUE",
                        help="overrides of both sweeps (e.g. load.duration=15)")
    args = parser.parse_args()
    probe = load_tuning_params(args.params, args.set).fidelity
    print(f"{args.params.name}: probe of {probe.prompts} prompts x {probe.max_new_tokens} "
          f"tokens, {probe.concurrency} at a time", flush=True)
    with tempfile.TemporaryDirectory() as folder:
        base = timed_sweep(args.params, [*args.set, "fidelity.prompts=0"], Path(folder) / "off")
        probed = timed_sweep(args.params, args.set, Path(folder) / "on")
    print(f"sweep without the probe {base:.1f} s, with it {probed:.1f} s: "
          f"{probed / base:.3f}x ({(probed - base) / base:+.1%}; target <= +10%)")


if __name__ == "__main__":
    main()
