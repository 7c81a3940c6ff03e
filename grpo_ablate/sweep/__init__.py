"""Sweeps: many ordinary training runs, planned as a matrix and launched through Hydra.

The modules, one line each: docs/design.md#the-sweep-package
Names starting with _ stay inside their module; what another module needs is public.
"""
