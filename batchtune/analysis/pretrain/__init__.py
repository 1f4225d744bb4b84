"""Pre-training: the steps-data trade-off, B_opt/B_min, grids and batch schedules."""
