"""A rollout's optional fields (sampler log-probs, ages, kept, and whatever comes next) are each
declared once on `Rollout` and carried by every operation on rows: here for every
declared field, so a new one is tested the day it is declared."""
from dataclasses import fields

import torch

from grpo_ablate.sampling.decode import Rollout, concat_rollouts, select_rows

OPTIONAL = [f for f in fields(Rollout) if f.metadata]


def rollout(n: int, prompt: int, width: int, with_optional: bool) -> Rollout:
    g = torch.Generator().manual_seed(n * 100 + width)
    values = {f.name: (torch.randn(n, width, generator=g) if f.metadata["per"] == "token"
                       else torch.randint(1, 5, (n,), generator=g).to(torch.tensor(f.metadata["fill"]).dtype))
              for f in OPTIONAL} if with_optional else {}
    tokens = torch.randint(0, 9, (n, prompt + width), generator=g)
    return Rollout(tokens, torch.ones_like(tokens), prompt, torch.ones(n, width), torch.zeros(n, dtype=torch.bool),
                   **values)


def test_every_optional_field_is_declared_with_how_it_stacks():
    assert {f.name for f in OPTIONAL} >= {"sampler_logprobs", "ages", "kept"}
    assert all(f.metadata["per"] in ("token", "row") and "fill" in f.metadata for f in OPTIONAL)


def test_select_rows_and_to_carry_every_optional_field():
    roll, rows = rollout(4, 2, 3, True), torch.tensor([2, 0])
    picked, moved = select_rows(roll, rows), roll.to("cpu")
    for f in OPTIONAL:
        assert torch.equal(getattr(picked, f.name), getattr(roll, f.name)[rows]), f.name
        assert torch.equal(getattr(moved, f.name), getattr(roll, f.name)), f.name


def test_concat_stacks_every_optional_field_as_declared():
    a, b, bare = rollout(2, 2, 4, True), rollout(3, 3, 2, True), rollout(1, 2, 3, False)
    both = concat_rollouts([a, b], pad_id=0)
    for f in OPTIONAL:
        got = getattr(both, f.name)
        if f.metadata["per"] == "token":      # right-padded to the widest completion
            assert got.shape == (5, 4) and torch.equal(got[2:, 2:], torch.full((3, 2), f.metadata["fill"]))
            assert torch.equal(got[:2], getattr(a, f.name)) and torch.equal(got[2:, :2], getattr(b, f.name))
        else:
            assert torch.equal(got, torch.cat([getattr(a, f.name), getattr(b, f.name)]))
    mixed = concat_rollouts([a, bare], pad_id=0)
    for f in OPTIONAL:                        # a part without the field: per token none, per row its fill
        got = getattr(mixed, f.name)
        if f.metadata["per"] == "token":
            assert got is None
        else:
            assert got[-1].item() == f.metadata["fill"] and torch.equal(got[:2], getattr(a, f.name))
