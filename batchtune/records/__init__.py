"""The records batchtune writes and reads, and the results store that holds them.

Layout of a results directory (documented in docs/formats.md)::

    manifest.json              the recipe the probe ran with (checked on resume)
    runs/<run_id>/steps.jsonl  one StepRecord per line, appended as training goes
    runs/<run_id>/run.json     the RunRecord, written atomically when the run ends
    throughput.jsonl           ThroughputPoint lines (generation and training timings)
    profiles/<id>.model.json   the ModelInfo (shape) of the model a profile measured
    plots/                     PNG figures

A run is finished exactly when its run.json exists. A run without one is redone from scratch on
resume; its stale steps file is kept beside it (renamed), so nothing is lost. Writers of one run hold
an exclusive lock on ``runs/<run_id>/.lock``, so two processes on one directory never write the same
run; appends to throughput.jsonl are single ``write`` calls under a lock.

Modules: ``types`` (the record dataclasses and run statuses), ``store`` (``ResultsStore``, ``RunWriter``),
``check`` (a sealed run is the run batchtune wrote), ``files`` (atomic writes, JSON lines, locks) and
``paths`` (every path written stays inside the results directory).
"""
