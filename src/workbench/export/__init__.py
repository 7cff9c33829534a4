"""``workbench export``: a run's records as training rows.

    exporter       export_run and its summary
    options        what an export is asked for and what it did
    sources        one dataset's records checked and turned into rows
    sinks          where rows go: JSON lines, Parquet, a trainer's JSONL
    conversations  a reply as an assistant turn, re-rendered with the chat template
    trainers       --for specforge|speculators: rows, manifest, lengths, command
"""
