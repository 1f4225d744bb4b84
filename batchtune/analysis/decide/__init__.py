"""Decisions: the time-to-target ranking, the recommendation and the config check."""
