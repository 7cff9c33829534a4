"""The benchmarks generate is given are the run's: run.json names them, a resumed run keeps
looking for them, and validate, the reports and export look for them unless told otherwise;
a benchmark file that moved is said, never silently forgotten."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

from conftest import BENCH, EXAMPLES, jsonl, text_prompts, workbench, write_manifest

from workbench.analyze import quality_frames
from workbench.analyze.scan import scan_run
from workbench.report import plots
from workbench.report.render import cell_data, run_report
from workbench.rundir.figures import OVERLAP_ENTRY, load_figures, overlaps_path
from workbench.rundir.manifest import (
    BenchmarkChoice,
    benchmarks_record,
    choose_benchmarks,
    read_manifest,
)
from workbench.server.launch import ServerProcess


def test_choose_benchmarks_takes_the_given_else_the_recorded_that_still_exist(tmp_path: Path) -> None:
    here, gone = tmp_path / "here.jsonl", tmp_path / "gone.jsonl"
    here.write_text('{"question": "q"}\n')
    record = {"benchmarks": {"files": [str(here), str(gone)], "field": "question", "ngram": 9}}
    assert choose_benchmarks({}, None) == BenchmarkChoice()
    assert choose_benchmarks(record, ["a.jsonl"]) == BenchmarkChoice(("a.jsonl",), None, 13)
    assert choose_benchmarks(record, []) == BenchmarkChoice()  # --no-decontaminate
    taken = choose_benchmarks(record, None)
    assert taken == BenchmarkChoice((str(here),), "question", 9, recorded=True, gone=(str(gone),))
    assert choose_benchmarks(record, None, "prompt", 5)[1:3] == ("prompt", 5)
    notes = taken.notes()
    assert notes[0].startswith("looking for the run's benchmarks (run.json): here.jsonl")
    assert notes[1].startswith(f"{gone}: a benchmark of this run") and "--decontaminate" in notes[1]
    assert choose_benchmarks(record, ["a.jsonl"]).notes() == []
    for bad in ("x", {"files": "a"}, {"files": [3, ""]}):  # an edited run.json: none
        assert choose_benchmarks({"benchmarks": bad}, None).files == ()
    odd = choose_benchmarks({"benchmarks": {"files": [str(here)], "ngram": True, "field": 1}}, None)
    assert (odd.field, odd.ngram) == (None, 13)


def test_benchmarks_record_is_absolute_and_keeps_the_gone_ones() -> None:
    assert benchmarks_record(BenchmarkChoice()) is None
    record = benchmarks_record(BenchmarkChoice(("b.jsonl",), "question", 7, gone=("/x/old.jsonl",)))
    assert record == {"files": [str(Path("b.jsonl").resolve()), "/x/old.jsonl"],
                      "field": "question", "ngram": 7}


def _generate(sim: ServerProcess, manifest: Path, out: Path, *args: str,
              cwd: Path | None = None) -> str:
    done = workbench("generate", "--datasets", str(manifest), "--server", sim.url, "--out", str(out),
                     "--progress-interval", "30", *args, cwd=cwd)
    assert done.returncode == 0, done.stderr
    return done.stdout + done.stderr


def _counts(text: str) -> dict[str, int]:
    """`rule count` of validate's text report."""
    found = {}
    for line in text.splitlines():
        parts = line.split()
        if len(parts) >= 3 and parts[0] in ("error", "warning", "info"):
            found[parts[1]] = int(parts[2].replace(",", ""))
    return found


def test_the_run_keeps_its_benchmarks_for_resume_validate_reports_and_export(
    tmp_path: Path, shared_sim: ServerProcess,
) -> None:
    folder = tmp_path / "job"
    (folder / "bench").mkdir(parents=True)
    shutil.copy(BENCH, folder / "bench" / "tiny.jsonl")
    tokenizer = folder / "tokenizer"
    shutil.copytree(EXAMPLES / "tokenizer", tokenizer)
    manifest = write_manifest(folder, [{"name": "t", "path": str(text_prompts(folder, 24)),
                                        "input": "text", "max_samples": 16}],
                              tokenizer=str(tokenizer))
    out = tmp_path / "out"
    sim = shared_sim
    _generate(sim, manifest, out, "--decontaminate", "bench/tiny.jsonl", cwd=folder)  # relative
    bench = folder / "bench" / "tiny.jsonl"
    assert read_manifest(out)["benchmarks"] == {"files": [str(bench)], "field": None, "ngram": 13}

    # validate, from another folder, looks for them without being told, and says so
    elsewhere = tmp_path / "elsewhere"
    elsewhere.mkdir()
    quoting = {f"t/{p['sample_id']}" for p in jsonl(out / "t" / "prompts.jsonl")
               if p["sample_id"] % 4 == 0}  # every fourth prompt quotes tb-3; 16 of 24 drawn
    checked = workbench("validate", str(out), cwd=elsewhere)
    assert checked.returncode == 0, checked.stderr
    assert _counts(checked.stdout)["contaminated_prompt"] == len(quoting) > 0
    assert "contamination: checked against tiny (from run.json)\n" in checked.stdout
    assert checked.stdout.count("checked against") == 1 and "note" not in checked.stderr  # once
    plain = workbench("validate", str(out), "--no-decontaminate", "--json")
    assert plain.returncode == 0 and plain.stderr == ""
    data = json.loads(plain.stdout)
    assert data["benchmarks"] == [] and "contaminated_prompt" not in plain.stdout
    assert json.loads(workbench("validate", str(out), "--json").stdout)["benchmarks"] == ["tiny"]

    # export --drop contaminated takes them too
    rows = tmp_path / "rows.jsonl"
    exported = workbench("export", str(out), "--to", str(rows), "--drop", "contaminated")
    assert exported.returncode == 0, exported.stderr
    assert f"contaminated {len(quoting)}" in exported.stdout
    assert len(jsonl(rows)) == 16 - len(quoting)
    assert {row["id"] for row in jsonl(rows)}.isdisjoint(quoting)

    # a resumed run keeps looking for them: the new replies' overlaps are kept too
    manifest = write_manifest(folder, [{"name": "t", "path": str(folder / "texts.jsonl"),
                                        "input": "text"}], tokenizer=str(tokenizer))  # all 24
    said = _generate(sim, manifest, out)
    assert "looking for the run's benchmarks (run.json): tiny.jsonl" in said
    benchmarks = quality_frames.decontamination(out, None)
    assert benchmarks.decontaminate is not None and benchmarks.decontaminate.names == ["tiny"]
    store = load_figures(overlaps_path(out / "t", benchmarks.decontaminate), OVERLAP_ENTRY)
    assert store is not None and len(store) == 24

    # the report looks for them by default
    report = run_report("format_validation", None, {"run_dir": str(out)}, tmp_path / "reports")
    table = cell_data(report.notebook_path, "contamination")
    assert [(r["benchmark"], r["prompts"]) for r in table] == [("tiny", 6)]  # 0, 4, ..., 20

    # moved away: said by validate and the report, refused by export, remembered by run.json
    bench.rename(folder / "bench" / "moved.jsonl")
    checked = workbench("validate", str(out))
    assert checked.returncode == 0, checked.stderr
    assert "contaminated_prompt" not in checked.stdout
    assert f"{bench}: a benchmark of this run (run.json) that is no longer there" in checked.stdout  # a note that asks for something, in the text
    gone = quality_frames.decontamination(out, None)
    view = plots.contamination_view(quality_frames.contamination_table(scan_run(out, workers=1), None),
                                    gone.notes).html
    assert "no longer there" in view and "No benchmark looked for" in view
    refused = workbench("export", str(out), "--to", str(tmp_path / "no.jsonl"), "--drop", "contaminated")
    assert refused.returncode == 2 and not (tmp_path / "no.jsonl").exists()
    assert len(refused.stderr.strip().splitlines()) == 1 and str(bench) in refused.stderr
    said = _generate(sim, manifest, out)
    assert f"{bench}: a benchmark of this run" in said
    assert read_manifest(out)["benchmarks"]["files"] == [str(bench)]
    moved = workbench("validate", str(out), "--decontaminate", str(folder / "bench" / "moved.jsonl"))
    assert _counts(moved.stdout)["contaminated_prompt"] == 6

    # the run's tokenizer gone: its benchmarks are still looked for in the text prompts, and
    # validate says the ids are not read; export, which must not miss a record, refuses
    (folder / "bench" / "moved.jsonl").rename(bench)
    tokenizer.rename(folder / "elsewhere")
    partial = workbench("validate", str(out))
    assert partial.returncode == 0, partial.stderr
    assert _counts(partial.stdout)["contaminated_prompt"] == 6
    assert "looked for in text prompts only, not in ids" in partial.stdout
    assert "--tokenizer DIR" in partial.stdout
    refused = workbench("export", str(out), "--to", str(tmp_path / "no.jsonl"), "--drop", "contaminated")
    assert refused.returncode == 2 and "tokenizer" in refused.stderr
    assert not (tmp_path / "no.jsonl").exists()
    (folder / "elsewhere").rename(tokenizer)

    # --no-decontaminate: the run forgets them
    _generate(sim, manifest, out, "--no-decontaminate")
    assert read_manifest(out)["benchmarks"] is None
    assert json.loads((out / "run.json").read_text())["options"]["decontaminate"] == []
