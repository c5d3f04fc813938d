"""Dataset readers and generators."""
