"""System throughput: generation and training profiles, rooflines, contention, pipelines."""
