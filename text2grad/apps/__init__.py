"""Applications built on top of the three phases: evaluation suites, the offline quickstart, tiny data, the CLI.

Nothing in `text2grad.core` or in a phase package imports from here.
"""
