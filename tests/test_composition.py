"""Composition once per process (config._hydra_compose): the same config as Hydra's, a copy the caller
may change, composed afresh when a conf file changes, and a sweep's plan composes each run once.
The conf files read once (grpo_ablate/config/composition.py) compose what Hydra does, node for node, and
leave to Hydra what they do not follow and what it refuses."""
import os
import shutil
import sys
from importlib import resources

import pytest
from omegaconf import DictConfig, ListConfig, OmegaConf

from conftest import cli_here
from grpo_ablate.config import composition, compose as config


def test_a_composition_is_hydras_and_a_copy_the_caller_may_change():
    overrides = ["adv=rae", "optim.lr=3e-4", "+trick=no_std"]
    first = config.compose(overrides)
    fresh = config._hydra_composed(tuple(overrides))   # Hydra itself, past the cache
    assert OmegaConf.to_container(first) == OmegaConf.to_container(fresh)   # interpolations unresolved in both
    assert OmegaConf.is_struct(first) and OmegaConf.is_struct(fresh)
    first.optim.lr = 9.0
    first.adv.name = "changed"
    again = config.compose(overrides)
    assert again.optim.lr == 3e-4 and again.adv.name == "rae"


def test_a_conf_file_written_since_composes_afresh(tmp_path, monkeypatch):
    """An edit of a conf file (a contributor's, or `make catalogue`'s) is seen by the next composition
    in the same process, not the config cached before it."""
    shutil.copytree(str(resources.files(config.CONFIG_MODULE)), tmp_path / "conf_copy")
    monkeypatch.syspath_prepend(str(tmp_path))
    monkeypatch.setattr(config, "CONFIG_MODULE", "conf_copy")
    monkeypatch.delitem(sys.modules, "conf_copy", raising=False)
    assert config.compose([]).optim.lr == 2e-4
    config_yaml = tmp_path / "conf_copy" / "config.yaml"
    config_yaml.write_text(config_yaml.read_text().replace("lr: 2.0e-4", "lr: 3.0e-4"))
    assert config.compose([]).optim.lr == 3e-4


@pytest.mark.full
def test_a_sweeps_plan_composes_each_run_once(tmp_path, monkeypatch):
    """`sweep --dry-run` plans (every variant), then checks the warm starts (every variant again):
    Hydra composes each list of overrides once, the second look is the cache's."""
    config._composed.cache_clear()
    composed = []
    real = composition.compose

    def counted(module, name, overrides):
        composed.append(tuple(overrides))
        return real(module, name, overrides)

    monkeypatch.setattr(composition, "compose", counted)
    r = cli_here("sweep", "leave-one-out", "--tricks", "clip_higher,token_mean", "--seeds", "2", "--allow-inert",
                 "--dry-run", cwd=tmp_path)
    assert r.exit_code == 0, r.output
    assert "drop-clip_higher" in r.stdout and list(tmp_path.iterdir()) == []
    assert composed and len(composed) == len(set(composed)), [o for o in set(composed) if composed.count(o) > 1]


def _nodes(node, path="", out=None) -> list:
    """Every node of a config with its type and flags: two configs equal here behave the same."""
    out = [] if out is None else out
    out.append((path, type(node).__name__, dict(node._metadata.flags), node._metadata.ref_type,
                node._metadata.object_type, node._metadata.key))
    children = node.keys() if isinstance(node, DictConfig) else range(len(node)) if isinstance(node, ListConfig) else ()
    for key in children:
        _nodes(node._get_node(key), f"{path}.{key}", out)
    return out


def _options() -> dict[str, list[str]]:
    root = str(resources.files(config.CONFIG_MODULE))
    return {group: sorted(f[:-5] for f in os.listdir(os.path.join(root, group)) if f.endswith(".yaml"))
            for group in sorted(os.listdir(root)) if os.path.isdir(os.path.join(root, group)) and group[0] != "_"}


def _assert_as_hydra(overrides: list[str]) -> None:
    fast = composition.compose(config.CONFIG_MODULE, config.CONFIG_NAME, overrides)
    assert fast is not None, f"{overrides}: left to Hydra"
    hydras = config._hydra_composed(tuple(overrides))
    assert OmegaConf.to_yaml(fast) == OmegaConf.to_yaml(hydras), overrides
    assert _nodes(fast) == _nodes(hydras), overrides


def _every_option_once() -> list[list[str]]:
    """Few override lists that choose every option of every group (a preset each), all named tricks
    together (overriding each other's families: the last one's choice wins) and some values."""
    groups = {g: o for g, o in _options().items() if g not in ("trick", "preset")}
    presets, tricks = _options()["preset"], _options()["trick"]
    lists = [[f"{g}={o[i % len(o)]}" for g, o in groups.items()] + [f"preset={presets[i % len(presets)]}"]
             for i in range(max(len(o) for o in [*groups.values(), presets]))]
    return lists + [["+trick=[" + ",".join(tricks) + "]", "optim.lr=3e-4", "+model.dtype=bfloat16", "seed=3"],
                    ["model=tiny_aligned", "control=base", "control.sample=false", "reward.wrong=-1"],
                    ["++optim.lr=1", "sweep.tricks=[a,b]", "+trick=no_std", "~metrics"]]


@pytest.mark.full
def test_the_conf_files_compose_as_hydra_composes_them():
    for overrides in _every_option_once():
        _assert_as_hydra(overrides)


@pytest.mark.slow
def test_every_option_and_named_trick_alone_composes_as_hydra_composes_it():
    for group, names in _options().items():
        for name in names:
            _assert_as_hydra([f"+trick={name}"] if group == "trick" else [f"{group}={name}"])


@pytest.mark.parametrize("overrides", [["adv=nope"], ["foo=1"], ["+adv.decay=0.5", "adv=rae"], ["trick=no_std"],
                                       ["+adv=grpo"], ["seed=0,1"], ["~kl"], ["hydra.job.name=x"]])
def test_what_hydra_refuses_or_the_conf_files_do_not_follow_is_left_to_hydra(overrides):
    assert composition.compose(config.CONFIG_MODULE, config.CONFIG_NAME, overrides) is None


@pytest.mark.parametrize("text", ["run.name=all@base-like-s0", "sweep.variant=drop-no_std@aligned-like",
                                  "model=tiny_aligned",
                                  "a=x-", "a=x--y", "a=_", "a_b.c_d=e1", "a=TRUE", "a=Null", "a=iNf", "a=false",
                                  "a=1", "a=1e-3", "+a=b", "a=[x,y]", "a=x.y", "a=x y", "a='q'", "a=${b}", "a=x/y",
                                  "a=-1", "a=0", "a=-0", "a=007", "a=1_000", "a=+3", "a=[]", "a=[x]",
                                  "a=[x, y]", "a=[1,x]", "a=[x,true]", "a=[[x]]", "a=-x",
                                  "a=grpo.level-easy.wrong--1-s0", "a=inf.x", "a=x.", "a=x..y", "a=[x.y,z]"])
def test_an_override_read_without_hydras_parser_is_the_one_it_parses(text):
    from hydra.core.override_parser.overrides_parser import OverridesParser

    assert composition._parsed_override(text) == OverridesParser.create().parse_overrides([text])[0]


def test_a_config_built_from_an_earlier_one_is_the_one_built_afresh(monkeypatch):
    """A composition sets, on a copy of the last config with its top-level keys, the values that differ:
    node for node what OmegaConf.create builds (including a family whose keys change, and a value whose
    type changes from int to float to bool)."""
    monkeypatch.setattr(composition, "_BUILT", {})
    for overrides in (["adv=grpo"], ["adv=rae", "kl=adaptive", "steps=3"], ["adv=grpo", "steps=3.0"],
                      ["control=base", "steps=true"]):
        built = composition.compose(config.CONFIG_MODULE, config.CONFIG_NAME, overrides)
        fresh = OmegaConf.create(OmegaConf.to_container(built))
        OmegaConf.set_struct(fresh, True)
        assert _nodes(built) == _nodes(fresh) and OmegaConf.to_yaml(built) == OmegaConf.to_yaml(fresh), overrides
    assert len(composition._BUILT) == 1


def test_the_conf_files_read_as_omegaconf_reads_them():
    """composition's YAML reader (libyaml's parser) reads every conf file, and OmegaConf's corner cases
    (floats without a dot, no timestamps, a duplicate key), as OmegaConf's own reader does."""
    import glob

    import yaml
    from omegaconf._utils import get_yaml_loader

    root = str(resources.files(config.CONFIG_MODULE))
    texts = [open(f, encoding="utf-8").read() for f in sorted(glob.glob(f"{root}/**/*.yaml", recursive=True))]
    texts.append("a: 1e-3\nb: 2024-01-01\nc: .5\nd: +1_000.5\ne: .inf\nf: on\ng: 0x10\nh: ~\n")
    for text in texts:
        loaders = (composition._yaml_loader(), get_yaml_loader())
        ours, omegaconfs = (yaml.load(text, Loader=loader) for loader in loaders)
        assert repr(ours) == repr(omegaconfs)
    with pytest.raises(composition.Unsupported):
        yaml.load("a: 1\na: 2\n", Loader=composition._yaml_loader())


@pytest.mark.parametrize("overrides", [["seed=3", "optim.lr=1e-3", "run.name=a@b-s0", "run.tags=[x,y]",
                                        "reward.correct=2"],
                                       ["optim.lr=2", "++optim.lr=1", "optim.lr=3", "+model.dtype=bfloat16"],
                                       ["model.path=/x", "reward.wrong=-1", "sweep.tricks=[a,1,null]", "run.tags=[]"]])
def test_values_set_before_the_config_is_built_are_those_hydra_sets(overrides):
    """The leading overrides that change a plain value are set on the merged data, the rest by Hydra in
    their order: the config Hydra composes either way."""
    _assert_as_hydra(overrides)


def test_an_override_hydra_refuses_is_refused_by_hydras_parser():
    from hydra.errors import OverrideParseException

    with pytest.raises(OverrideParseException):
        composition._parsed_override("a=[x,]")


@pytest.mark.parametrize("preset", sorted(p.name.removesuffix(".yaml") for p in
                                           resources.files(config.CONFIG_MODULE).joinpath("preset").iterdir()
                                           if p.name.endswith(".yaml")))
def test_no_shipped_preset_falls_back_to_hydra(preset, hydra_fallbacks):
    """Every preset, alone and with a trick on top, is composed here, not by Hydra (the fast path holds)."""
    config.compose([f"preset={preset}"])
    config.compose([f"preset={preset}", "+trick=clip_higher"])
    assert hydra_fallbacks == []


def test_the_fast_path_follows_only_the_releases_it_was_written_for(monkeypatch):
    """Under another Hydra or OmegaConf release Hydra composes (the private APIs followed may have moved);
    a fault of the fast path itself is raised, not hidden behind Hydra's composition."""
    assert composition.FOLLOWED
    monkeypatch.setattr(composition, "FOLLOWED", False)
    assert composition.compose(config.CONFIG_MODULE, config.CONFIG_NAME, []) is None
    monkeypatch.setattr(composition, "FOLLOWED", True)
    monkeypatch.setattr(composition, "_merge", lambda *a: 1 / 0)
    with pytest.raises(ZeroDivisionError):
        composition.compose(config.CONFIG_MODULE, config.CONFIG_NAME, [])
