"""The trick catalogue: pure tensor functions registered by name, one module per family.

This package imports only torch. The trainer looks a trick up by the name its config group
chose (`cfg.adv.name`, `cfg.loss_agg.mode`, ...) and never branches on that name itself, so
adding a trick is one registered function, one YAML file and one test.
"""
