"""``workbench generate``: every prompt of a dataset manifest sent, each reply kept once.

    prompts       dataset files (JSONL, Parquet) turned into the prompts sent
    plan          what to send: datasets, order, budgets, the resume check (no asyncio)
    resume        what an earlier run left: finished records, rejected lines, prompts sent
    dispatch      the Runner: one run, from the open run directory to its summary
    feed          what is sent next: the queues, the slots, the token budgets
    attempts      one prompt's attempts: payload, deadline and abort, retries, its record
    servers       the outage gate, the workers behind a router and their readings
    run_manifest  run.json while the run goes, the session's events
    writer        records on disk whole, counted once there, held while the disk says no
    gate          the pause of the whole run while the server or the disk is gone
    session       run_generation: probe, preflight, the writer's lock, the run
    progress      the live counters and the progress line
    views         progress lines and bars, the closing summary
    concurrency   the run's request slots: a fixed cap or auto, steered from /metrics
    budget        the projection that keeps a token budget
"""
