"""Composition once per process (config._hydra_compose): the same config as Hydra's, a copy the caller
may change, composed afresh when a conf file changes, and a sweep's plan composes each run once.
The conf files read once (grpo_ablate/composition.py) compose what Hydra does, node for node, and
leave to Hydra what they do not follow and what it refuses."""
import os
import shutil
import sys
from importlib import resources

import pytest
from omegaconf import DictConfig, ListConfig, OmegaConf

from conftest import cli_here
from grpo_ablate import composition, config


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
