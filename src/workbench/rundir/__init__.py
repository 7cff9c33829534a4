"""The run directory: the one owner of a run's files. No other module opens them by name.

    layout       the file names and the dataset folders; how a run's datasets are found
    run          a run as one value (RunInfo, load_run) and the run check
    manifest     run.json: the one reader and writer, its history of sessions
    records      the data contract: records, what a finished one is, whole appends, fast reads
    storage      a write the machine refuses: one error naming the file and the free space
    files        whole-file (atomic) writes and backups
    cursor       files read from a remembered offset (what changed since the last read)
    cache        the caches beside each dataset (.workbench-cache/)
    columns      what one scan keeps per record, and its cache
    prompt_scan  one read of prompts.jsonl, shared by validation, stats and reports
    lock         the writer's lock (who is generating into the run right now)
    rates        tok/s from the records' times: the one definition every view shows
"""
