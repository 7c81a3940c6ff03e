"""Whether W&B can go online: an API key from the environment or ~/.netrc, never the network.

Runs (`train/run_log.py`) and the report's `--wandb` both choose their mode from this: online
with a key, offline (files under the run dir, `wandb sync` later) without one.
"""
from __future__ import annotations

import os


def wandb_api_key() -> str | None:
    """An API key from the environment or ~/.netrc, without touching the network."""
    if os.environ.get("WANDB_API_KEY"):
        return os.environ["WANDB_API_KEY"]
    try:
        import netrc

        auth = netrc.netrc().authenticators("api.wandb.ai")
        return auth[2] if auth else None
    except (OSError, netrc.NetrcParseError):
        return None


def resolve_mode(mode: str) -> str:
    """`auto` -> $WANDB_MODE if set, else online with a key and offline without."""
    if mode != "auto":
        return mode
    return os.environ.get("WANDB_MODE") or ("online" if wandb_api_key() else "offline")
