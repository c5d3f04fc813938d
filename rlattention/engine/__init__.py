"""Training loop, checkpoints, logging, distributed launch and config loading (method-independent)."""
