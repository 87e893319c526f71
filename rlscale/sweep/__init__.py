"""`rlscale sweep`: the batch-size study at small scale, and the planner checked against it (docs/planner.md)."""
