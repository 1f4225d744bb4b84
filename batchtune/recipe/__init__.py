"""Recipes: the schema (the only defaults), loading (TOML, --set, shipped recipes) and cross-field checks."""
