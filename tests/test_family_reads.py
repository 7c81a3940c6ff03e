"""Every declared trick family is looked up by a real training step: a family without a call site
would train, sweep and report as a no-op (tests/family_reads.py records the lookups; the throwaway
family of tests/test_throwaway.py shows it listed before its call site is added, and gone after)."""
from family_reads import unread_families


def test_every_declared_family_is_read_by_a_training_step(small, tmp_path):
    # the default options suffice: every family's bound option is looked up whatever it is
    assert unread_families(small + ["steps=1", "eval.every=1"], tmp_path / "run") == []
