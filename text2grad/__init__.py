"""text2grad: reinforcement learning from natural-language feedback."""
__version__ = "0.1.0"
