"""The pure numerical core: numpy and scipy only, no torch, vllm, rich or typer.

Every function takes arrays and returns small frozen records; it can be rerun from records on disk alone.
"""
