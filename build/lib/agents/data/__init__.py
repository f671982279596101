"""Data preparation helpers (agents layer: pure): verl-format rows, prompt limits, task sources."""
