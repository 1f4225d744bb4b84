"""Rendering: terminal tables, progress, plots and JSON output, from result objects."""
