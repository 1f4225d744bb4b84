"""Branched probes: local ratios from a trunk, their summary, progress fits, schedules."""
