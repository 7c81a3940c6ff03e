"""`python -m grpo_ablate.cli`: the `grpo-ablate` command."""
from grpo_ablate.cli.app import main

main()
