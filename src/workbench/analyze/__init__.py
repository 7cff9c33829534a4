"""Reading a run: the one scan, its validation, the statistics and the report frames.

    rules       the format rules and the per-record checks of a model profile
    findings    a dataset's findings: counts, rates, severities, examples
    scan        the one scan of a run (validation and the reports' columns), cached
    validate    ``workbench validate``
    quality     duplicates and benchmark contamination across a run
    quality_frames  the data-quality section of a report, as shaped data
    score       ``workbench score``: each reply's likelihood under the target
    stats       per-dataset statistics, refreshed incrementally (the monitor's too)
    counters    what the statistics count of each file
    eta         targets, rates, progress and ETA
    stats_text  ``workbench stats`` as text or JSON
    subset      the sent subset of each dataset against the whole
    frames      the run's header and one row per record: distributions, the explorer's filters
    tables      per-dataset tables: reasoning, finish reasons, budgets, findings (over time)
    readback    records read back from the files and shown: examples, samples, one record, search
    conversations  conversations regenerated turn by turn: turns per conversation, tokens by
                turn, early ends by reason
    turn_prompts  validate's check of each turn's prompt against the rendering of its history
    chat_data   the data rows behind a run's conversations, read through run.json
    explore     the notebooks' API: the report frames of the modules above, re-exported
"""
