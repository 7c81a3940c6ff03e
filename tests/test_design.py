"""The design a sweep writes and a report reads (grpo_ablate/design.py): from_json undoes to_json,
and reads what older manifests wrote."""
from grpo_ablate.design import Context, Contrast, Variant
from grpo_ablate.sweep.contexts import with_contexts
from grpo_ablate.sweep.modes import build_matrix

FAMILIES = {"a": "adv", "b": "clip", "c": "kl"}


def test_from_json_undoes_to_json_for_every_mode():
    for mode in ("leave-one-out", "add-one-in", "ladder", "factorial", "pairwise"):
        m = build_matrix(mode, ["a", "b", "c"], FAMILIES)
        assert [Variant.from_json(v.to_json()) for v in m.variants] == m.variants
        assert [Contrast.from_json(c.to_json()) for c in m.contrasts] == m.contrasts


def test_from_json_undoes_to_json_across_contexts():
    contexts = [Context("easy", ("task.level=easy",)), Context("hard", ("task.level=hard",))]
    m = with_contexts(build_matrix("leave-one-out", ["a", "b"], FAMILIES), contexts)
    assert [Variant.from_json(v.to_json()) for v in m.variants] == m.variants
    assert [Contrast.from_json(c.to_json()) for c in m.contrasts] == m.contrasts
    assert m.contrasts[0].tested == "a" and Contrast.from_json(m.contrasts[0].to_json()).tested == "a"
    assert [Context.from_json(c.to_json()) for c in contexts] == contexts


def test_from_json_reads_what_older_manifests_wrote():
    """No overrides, a null list, no kind, an empty context: the defaults, as report/load.py read them."""
    v = Variant.from_json({"name": "all", "tricks_on": None, "reference": None, "kind": None, "context": ""})
    assert v == Variant("all")
    assert Contrast.from_json({"trick": "a", "with": "all", "without": "drop-a"}) == Contrast("a", "all", "drop-a")
    assert Context.from_json({"name": "easy"}) == Context("easy")
