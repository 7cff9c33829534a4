"""Replies compared on what varies, where a dataset's replies share a template.

Replies of a function-calling dataset share their boilerplate: the tool-call markers, the
call's JSON keys, a stock preface. Two different calls then look alike, and a copy of a call
with one argument changed is lost among them. So where a dataset's replies have a template
(:mod:`workbench.sketch.template`: the shingles half of its first 1,000 compared replies
hold), its replies are compared on MinHash signatures without that template, read from its
raw file in place of the whole-reply ones the store and the scan keep
(:mod:`workbench.rundir.figures`). Replies without a template, the usual case, cost nothing
more.

Both are kept in the dataset's cache: the template under the digests of the replies it was
drawn from (drawn once while they stay), the signatures beside the raw file, appended as it
grows (a grown run reads what grew).
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence

import msgspec
import numpy as np

from workbench import sketch
from workbench.rundir.cache import AppendedCache, KeyedCache, cache_key, file_stamp
from workbench.rundir.columns import FileScan
from workbench.rundir.figures import NUM_PERM, SIGNATURE_DTYPE, concat
from workbench.rundir.layout import DatasetDir
from workbench.rundir.reader import iter_blocks, rows_at

__all__ = ["reply_templates", "template_signatures"]

TEMPLATE_VERSION = 2  # bump when a kept template changes meaning (2: another digest)


class _Kept(msgspec.Struct):
    shingles: bytes
    rows: int


_KEPT: KeyedCache[_Kept] = KeyedCache("reply-template", _Kept)


def reply_templates(datasets: Sequence[DatasetDir], scans: Sequence[FileScan],
                    compared: Mapping[str, np.ndarray], share: float = sketch.DEFAULT_TEMPLATE_SHARE,
                    cache: bool = True) -> dict[str, sketch.Template]:
    """Per dataset, the template of its replies: of the first TEMPLATE_ROWS records of
    `compared` (indexes of its scan's records), kept in its cache."""
    found: dict[str, sketch.Template] = {}
    for ds, scan in zip(datasets, scans, strict=True):
        first = compared[ds.name][:sketch.TEMPLATE_ROWS].tolist()
        if len(first) < sketch.MIN_TEMPLATE_ROWS:  # too few to tell: no template, nothing read
            found[ds.name] = sketch.Template(np.zeros(0, dtype=np.uint64), len(first), share)
            continue
        key = cache_key("reply-template", TEMPLATE_VERSION, share, sketch.DEFAULT_SHINGLE,
                        [scan.columns.digest[i] for i in first])
        kept = _KEPT.load(ds.folder, key) if cache else None
        if kept is None:
            ids = _ids_at(ds, scan, [scan.columns.line[i] for i in first])
            template = sketch.template_shingles(*concat(ids), share=share)
            kept = _Kept(template.shingles.tobytes(), template.rows)
            if cache:
                _KEPT.save(ds.folder, key, kept)
        found[ds.name] = sketch.Template(np.frombuffer(kept.shingles, dtype=np.uint64),
                                         kept.rows, share)
    return found


class _Signatures(msgspec.Struct):
    """Signatures without a template of a raw file's replies, by line, and the lines read."""

    line: list[int] = msgspec.field(default_factory=list)
    signature: list[bytes] = msgspec.field(default_factory=list)
    lines: int = 0


_SIGNATURES: AppendedCache[_Signatures] = AppendedCache("reply-signatures", _Signatures)


def template_signatures(ds: DatasetDir, template: sketch.Template, min_ids: int,
                        cache: bool = True) -> dict[int, bytes]:
    """line -> the MinHash signature (SIGNATURE_DTYPE bytes) without `template` of each reply
    of `min_ids` ids or more of the dataset's raw file: those kept, and the lines after."""
    key = cache_key("reply-signatures", TEMPLATE_VERSION, template.key, min_ids,
                    sketch.DEFAULT_SHINGLE, NUM_PERM)
    found = _SIGNATURES.load(ds.raw_path, key) if cache else None
    known, offset = found if found is not None else (_Signatures(), 0)
    stamp = file_stamp(ds.raw_path)
    end = offset
    for block in iter_blocks(ds.raw_path, offset=offset, first_line=known.lines + 1,
                             with_output_ids=True):
        if block.end_offset == block.start_offset:
            break  # a torn last line: read once it is whole
        rows = [row for row in block.rows if row.output_ids and len(row.output_ids) >= min_ids]
        if rows:
            flat, starts, ends = concat([np.asarray(row.output_ids, dtype=np.int64) for row in rows])
            sigs = sketch.signatures(flat, starts, sketch.clipped(starts, ends), num_perm=NUM_PERM,
                                     exclude=template.shingles).astype(SIGNATURE_DTYPE)
            known.line.extend(row.line for row in rows)
            known.signature.extend(sig.tobytes() for sig in sigs)
        known.lines = block.first_line + block.lines - 1
        end = block.end_offset
    if cache and end > offset:
        _SIGNATURES.save(ds.raw_path, key, known, end, stamp)
    return dict(zip(known.line, known.signature, strict=True))


def _ids_at(ds: DatasetDir, scan: FileScan, lines: Sequence[int]) -> list[np.ndarray]:
    """The output ids of the records at `lines` of the dataset's raw file (empty when gone)."""
    rows = rows_at(ds.raw_path, set(lines), scan)
    return [np.asarray(rows[line].output_ids if line in rows and rows[line].output_ids else [],
                       dtype=np.int64) for line in lines]
