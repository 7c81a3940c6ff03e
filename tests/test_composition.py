"""Composition once per process (config._hydra_compose): the same config as Hydra's, a copy the caller
may change, composed afresh when a conf file changes, and a sweep's plan composes each run once."""
import shutil
import sys
from importlib import resources

import hydra
from omegaconf import OmegaConf

from conftest import cli_here
from grpo_ablate import config


def test_a_composition_is_hydras_and_a_copy_the_caller_may_change():
    overrides = ["adv=rae", "optim.lr=3e-4", "+trick=no_std"]
    first = config.compose(overrides)
    fresh = config._composed.__wrapped__(tuple(overrides), ())   # Hydra itself, past the cache
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


def test_a_sweeps_plan_composes_each_run_once(tmp_path, monkeypatch):
    """`sweep --dry-run` plans (every variant), then checks the warm starts (every variant again):
    Hydra composes each list of overrides once, the second look is the cache's."""
    config._composed.cache_clear()
    composed = []
    real = hydra.compose

    def counted(config_name, overrides):
        composed.append(tuple(overrides))
        return real(config_name=config_name, overrides=overrides)

    monkeypatch.setattr(hydra, "compose", counted)
    r = cli_here("sweep", "leave-one-out", "--tricks", "clip_higher,token_mean", "--seeds", "2", "--allow-inert",
                 "--dry-run", cwd=tmp_path)
    assert r.exit_code == 0, r.output
    assert "drop-clip_higher" in r.stdout and list(tmp_path.iterdir()) == []
    assert composed and len(composed) == len(set(composed)), [o for o in set(composed) if composed.count(o) > 1]
