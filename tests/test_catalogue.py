"""The trick registry is the one place a trick's facts live; everything else is derived from it.

A throwaway option registered from a temporary module (through the public `register`, nothing
else touched) is range-checked, in the catalogue and its docs, in the family table of docs/config.md,
has an activity metric for the report and an inert rule; the files derived from the registry
(docs/tricks.md, docs/config.md's table, report/activity_table.py) are current; and no module keeps
a list of option or knob names of its own.
"""
import ast
import importlib.util
import sys

import pytest
from omegaconf import OmegaConf

from conftest import REPO
from grpo_ablate import catalogue
from grpo_ablate.config import ConfigError, compose, validate
from grpo_ablate.inert import chosen_tricks, inert_reason, requirement
from grpo_ablate.tricks.registry import all_options, declared_families, family_info, unregister

THROWAWAY = '''
import torch

from grpo_ablate.tricks.conditions import one_optimizer_step
from grpo_ablate.tricks.registry import POSITIVE, Activity, Claim, Inert, Allowed, Trick, register


@register("clip", "throwaway", off_policy_only=True,
          knobs={"eps": POSITIVE, "tau": Allowed(low=0, high=2)},
          activity=Activity("clip/throwaway_frac"),
          inert=Inert(one_optimizer_step, "cannot act with one optimizer step per rollout", "add updates.multi",
                      "several optimizer steps per rollout"),
          tricks=(Trick("throwaway_trick", what="a throwaway policy loss", source="tests/test_catalogue.py",
                        verdict="not_in_review",
                        claims=(Claim("helps", "model=base", "a test", "none: it is a test"),)),))
def throwaway_loss(logp, old_logp, advantages, mask, *, eps: float = 0.1, tau: float = 1.0):
    return -advantages * torch.exp(logp - old_logp), {}
'''


def import_module_from(path, name):
    spec = importlib.util.spec_from_file_location(name, path)
    module = importlib.util.module_from_spec(spec)
    sys.modules[name] = module
    spec.loader.exec_module(module)
    return module


@pytest.fixture
def throwaway(tmp_path):
    path = tmp_path / "throwaway_trick_module.py"
    path.write_text(THROWAWAY)
    import_module_from(path, "throwaway_trick_module")
    try:
        yield
    finally:
        unregister("clip", "throwaway")
        sys.modules.pop("throwaway_trick_module", None)


def with_clip(overrides, clip: dict):
    cfg = compose(overrides)
    OmegaConf.set_struct(cfg, False)
    cfg.clip = clip
    return cfg


def test_a_throwaway_option_is_checked_catalogued_documented_and_watched(throwaway):
    # range-checked, from its registration alone
    validate(with_clip([], {"name": "throwaway", "eps": 0.2, "tau": 1.5}))
    with pytest.raises(ConfigError, match=r"^clip.eps=-1.0 is not allowed; it must be a number > 0$"):
        validate(with_clip([], {"name": "throwaway", "eps": -1.0, "tau": 1.0}))
    with pytest.raises(ConfigError, match=r"clip.tau=3 is not allowed; it must be a number in \[0, 2\]"):
        validate(with_clip([], {"name": "throwaway", "eps": 0.1, "tau": 3}))
    with pytest.raises(ConfigError, match="clip.epz is not a setting of clip=throwaway; allowed: eps, tau"):
        validate(with_clip([], {"name": "throwaway", "epz": 0.1}))
    # in the catalogue (grpo-ablate tricks), its docs and the family table (docs/config.md)
    (row,) = [r for r in catalogue.load_catalogue() if r["name"] == "throwaway_trick"]
    assert (row["family"], row["option"], row["verdict"]) == ("clip", "throwaway", "not_in_review")
    assert row["requires"] == "several optimizer steps per rollout" and row["activity"] == "clip/throwaway_frac ≠ 0"
    docs = catalogue.docs_text()
    assert "`throwaway_trick` | `clip=throwaway` | a throwaway policy loss |" in docs
    assert "| `throwaway_trick` | *helps*: none: it is a test | model=base | a test |" in docs   # its claim
    assert {"effect": "helps", "where": "model=base", "source": "a test", "says": "none: it is a test"} \
        in eval(catalogue.claims_module().split("CLAIMS = ", 1)[1])["throwaway_trick"]
    assert "`throwaway`" in catalogue.option_table().split("| `clip` |")[1].splitlines()[0]
    # an activity metric for the report's *inert here* (report/activity_table.py once regenerated)
    assert catalogue.activity_table()[("clip", "throwaway")] == ("clip/throwaway_frac", "nonzero", None)
    assert "('clip', 'throwaway'): ('clip/throwaway_frac', 'nonzero', None)" in catalogue.activity_module()
    # an inert rule: train warns, sweep and doctor refuse, from the composed config
    one_step = with_clip([], {"name": "throwaway", "eps": 0.1, "tau": 1.0})
    assert inert_reason(one_step, "clip", "throwaway") == (
        "cannot act with one optimizer step per rollout: add updates.multi")
    assert "clip=throwaway" in chosen_tricks(one_step)
    assert inert_reason(with_clip(["updates=multi"], {"name": "throwaway", "eps": 0.1, "tau": 1.0}),
                        "clip", "throwaway") is None
    assert requirement("clip", "throwaway") == "several optimizer steps per rollout"
    assert not (REPO / "conf" / "clip" / "throwaway.yaml").exists()     # nothing else was touched


def test_a_knob_without_a_declared_range_is_refused_at_registration(tmp_path):
    path = tmp_path / "unranged_trick_module.py"
    path.write_text(THROWAWAY.replace('"tau": Allowed(low=0, high=2)', '').replace("throwaway", "unranged"))
    with pytest.raises(TypeError, match="clip=unranged: knob tau has no declared range"):
        import_module_from(path, "unranged_trick_module")
    unregister("clip", "unranged")


@pytest.mark.parametrize("bad, message", [
    ("knobs={'nope': POSITIVE}", "is not a keyword-only argument"),
    ("tricks=(Trick('clip_higher', what='w', source='s', verdict='baseline'),)",
     "trick clip_higher is registered twice"),
    ("tricks=(Trick('x', what='w', source='s', verdict='great'),)", "verdict 'great'"),
])
def test_registration_refuses_inconsistent_facts(tmp_path, bad, message):
    source = ("import torch\nfrom grpo_ablate.tricks.registry import POSITIVE, Trick, register\n"
              f"@register('clip', 'broken', {bad})\n"
              "def broken(logp, old_logp, advantages, mask):\n    return logp, {}\n")
    path = tmp_path / "broken_trick_module.py"
    path.write_text(source)
    try:
        with pytest.raises((TypeError, ValueError), match=message):
            import_module_from(path, "broken_trick_module")
    finally:
        unregister("clip", "broken")


def test_the_files_derived_from_the_registry_are_current():
    assert (REPO / "docs" / "tricks.md").read_text() == catalogue.docs_text(), "run `make catalogue`"
    page = catalogue.OPTIONS_PAGE.read_text()
    assert page == catalogue.with_option_table(page), "run `make catalogue`"
    assert catalogue.ACTIVITY_MODULE.read_text() == catalogue.activity_module(), "run `make catalogue`"
    assert catalogue.CLAIMS_MODULE.read_text() == catalogue.claims_module(), "run `make catalogue`"
    config = (REPO / "conf" / "config.yaml").read_text()
    assert config == catalogue.with_family_defaults(config), "run `make catalogue`"
    on_disk = {p.name: p.read_text() for p in (REPO / "conf" / "trick").glob("*.yaml")}
    assert on_disk == catalogue.trick_files(), "run `make catalogue`"


def test_a_generated_trick_file_composes_its_option_and_settings():
    cfg = compose(["+trick=ipo_loss"])
    assert cfg.clip.name == "dppo" and cfg.clip.divergence == "symmetric_tv" and cfg.clip.kl_tau == 1e-3
    assert dict(cfg.tricks) == {"ipo_loss": {"family": "clip", "option": "dppo"}}
    from grpo_ablate.config import default_options
    assert {f.name: f.default for f in declared_families()}.items() <= default_options().items()


def test_claims_are_data_the_report_can_check():
    from grpo_ablate.tricks.registry import Claim

    rows = {r["name"]: r for r in catalogue.load_catalogue()}
    # the papers' questions, each with the context it was asked in
    assert {(c["effect"], c["where"]) for c in rows["clip_higher"]["claims"]} >= {("helps", "model=aligned"),
                                                                                   ("does not help", "model=base")}
    assert ("hurts", "reward=0/1") in {(c["effect"], c["where"]) for c in rows["batch_norm"]["claims"]}
    assert ("helps", "data=easy") in {(c["effect"], c["where"]) for c in rows["no_std"]["claims"]}
    with pytest.raises(ValueError, match="effect 'great'"):
        Claim("great", "", "x", "y")
    with pytest.raises(ValueError, match="where model=chat"):
        Claim("helps", "model=chat", "x", "y")


def test_every_family_is_declared_and_in_the_family_order():
    from grpo_ablate.tricks import FAMILIES

    assert sorted(FAMILIES) == sorted(f.name for f in declared_families())
    assert {o.family for o in all_options() if "." not in o.family} == set(FAMILIES)
    assert all(family_info(f).summary for f in FAMILIES)


# ------------------------------------------------------------------ no hand-kept lists
def registry_names() -> tuple[set, set]:
    """Option names and knob/setting names that identify a trick (generic words left out)."""
    generic = {"none", "fixed", "batch", "clip", "static", "single", "enabled", "filter", "group", "penalty",
               "sequence", "uniform", "entropy", "multi", "c", "eps", "value", "lr", "alpha", "beta", "weight",
               "ratio", "delta", "target", "every", "high", "low", "lam", "gamma", "coef", "budget", "factor",
               "buffer", "weights", "epochs", "shuffle", "horizon", "threshold", "growth", "decay", "quantile"}
    options = {o.name for o in all_options()} - generic
    knobs = ({k for o in all_options() for k in o.ranges}
             | {k for f in declared_families() for k in f.settings}) - generic
    return options, knobs


def hand_kept_lists(path, options, knobs):
    """Collection literals of the module with >= 3 strings that are option names or knob names."""
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, (ast.List, ast.Tuple, ast.Set)):
            items = node.elts
        elif isinstance(node, ast.Dict):
            items = [k for k in node.keys if k is not None]
        else:
            continue
        strings = [e.value for e in items if isinstance(e, ast.Constant) and isinstance(e.value, str)]
        for found in (sorted(set(strings) & options), sorted(set(strings) & knobs)):
            if len(found) >= 3:
                yield f"{path.relative_to(REPO) if path.is_relative_to(REPO) else path.name}:{node.lineno} {found}"


def test_no_hand_kept_list_of_option_or_knob_names_outside_the_registry():
    """The registry (grpo_ablate/tricks/) is the one list: no other module of the package keeps
    one (config.py's range checks, report/activity.py's table and inert.py's rules read it), and
    the tests that kept their own (the named-trick metrics, the list of new tricks) derive them."""
    options, knobs = registry_names()
    paths = [p for p in (REPO / "grpo_ablate").rglob("*.py") if "tricks" not in p.parts
             and p.name not in ("activity_table.py", "claims_table.py")]   # generated from the registry
    found = [hit for path in paths for hit in hand_kept_lists(path, options, knobs)]
    assert not found, "; ".join(found)
    for path in (REPO / "tests").glob("test_*.py"):
        text = path.read_text()
        for name in ("FAMILY_METRIC", "OWN_METRIC", "EXTRA_METRIC", "NEW_TRICKS", "CONFIG_ONLY_FAMILIES",
                     "TRAINER_KEYS", "SUPPLIED_KNOBS"):
            assert f"{name} =" not in text, f"{path.name} keeps {name} again: read it from the registry"


def test_the_list_detector_finds_one(tmp_path):
    options, knobs = registry_names()
    path = tmp_path / "probe.py"
    path.write_text('for key in ("eps_low", "eps_high", "eps_max", "tau_pos"):\n    pass\n'
                    'FAMILY = {"gspo": 1, "sapo": 2, "gmpo": 3}\n')
    assert [h.split(" ", 1)[0] for h in hand_kept_lists(path, options, knobs)] == ["probe.py:1", "probe.py:3"]
