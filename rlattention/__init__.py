"""rlattention: visual attention trained with reinforcement learning."""

__version__ = "0.1.0"
