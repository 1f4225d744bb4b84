"""What each trainer (verl, TRL, OpenRLHF) calls things: reading its logs into batchtune records
(readers.py: read_log, import_runs, FORMATS; common.py: RunInfo, LogKeys) and writing the
recommendation in its units (emit.py: emit, RecommendationInput). Import from the submodules; this
package imports nothing, so loading one reader never loads the others or the analysis.
"""
