"""Measuring: the only layer that drives backends (plan, probe, profile); it writes records."""
