"""One training run: the GRPO loop and the no-RL controls, on one process or several.

The modules, one line each: docs/design.md#the-train-package
"""
