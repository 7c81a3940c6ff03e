"""The held-out eval as the papers and users measure it: a protocol (how many samples per problem,
at what temperature, which summaries: protocol.py), one eval of a policy under it (score.py), the
per-problem results and every summary computed from them (scores.py), and `grpo-ablate eval`,
which scores a finished run or sweep under another protocol or task (command.py). docs/evals.md.
"""
