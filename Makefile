# `make test` and `make demo` each build .venv from nothing, install what they need, and run.
PYTHON ?= python3
VENV := .venv
PY := $(VENV)/bin/python
STAMP := $(VENV)/.installed
# RLlib pins an older gymnasium than .venv has: it gets a venv and constraints of its own
RLLIB_VENV := .venv-rllib
RLLIB_PY := $(RLLIB_VENV)/bin/python
RLLIB_STAMP := $(RLLIB_VENV)/.installed
# TRL, transformers, datasets and verifiers: a venv of their own too (constraints-trl.txt says why; tokenizers, at
# the same pin, is in .venv as well);
# environments/bugfix_gym_verifiers is the verifiers env package `vf-eval bugfix_gym_verifiers` imports
TRL_VENV := .venv-trl
TRL_PY := $(TRL_VENV)/bin/python
TRL_STAMP := $(TRL_VENV)/.installed

.PHONY: test test-heavy test-all lint docs-tables demo demo-generalise venv bench algorithms-table clean interop-examples rllib rllib-venv test-rllib trl trl-venv test-trl

venv: $(STAMP)

# [interop]: SB3-contrib, TorchRL and Tianshou, whose tests run in `make test` (docs/interop.md)
$(STAMP): pyproject.toml constraints.txt
	test -x $(PY) || $(PYTHON) -m venv $(VENV)
	$(PY) -m pip install -q --upgrade pip
	$(PY) -m pip install -q -c constraints.txt -e ".[test,ray,interop]"
	touch $(STAMP)

# the fast suite, on up to 4 cores (pytest-xdist): within a minute on the 2-core machine; test-heavy runs the
# fast suite's longest tests (@pytest.mark.heavy), which CI runs too; test-all adds the slow statistical
# reproductions (@pytest.mark.slow)
test: $(STAMP)
	$(PY) -m pytest -m "not slow and not heavy" -n auto --maxprocesses 4

test-heavy: $(STAMP)
	$(PY) -m pytest -m "heavy and not slow" -n auto --maxprocesses 4

test-all: $(STAMP)
	$(PY) -m pytest

# flake8 over the repository, mypy over the packages (setup.cfg); .ci/run runs it after the tests
lint: $(STAMP)
	$(VENV)/bin/flake8
	$(VENV)/bin/mypy

# the settings tables of docs/ppo.md and docs/algorithms.md, from the config dataclasses and the presets
# (tests/test_settings_tables.py fails when they drift)
docs-tables: $(STAMP)
	$(PY) -m agents.algorithms.settings_tables docs/ppo.md docs/algorithms.md

demo: $(STAMP)
	$(VENV)/bin/bugfix-gym train

# the generalisation recipe (docs/generalisation.md): ~10 minutes on a first run, too long for `make demo`
demo-generalise: $(STAMP)
	$(VENV)/bin/bugfix-gym train --tasks generated

# the seeded algorithm table (docs/algorithms.md): every --algo name on the book and RL-only protocols,
# two runs at a time, resumable; hours, not part of `make bench`
algorithms-table: $(STAMP)
	$(PY) benchmarks/algorithms.py

# every benchmark once (docs/ has the figures and the machine they were measured on)
bench: $(STAMP)
	$(PY) benchmarks/env_throughput.py
	$(PY) benchmarks/sampling.py
	$(PY) benchmarks/ppo_update.py
	$(PY) benchmarks/reinforce_step.py
	$(PY) benchmarks/sandbox_overhead.py
	$(PY) benchmarks/worker_overhead.py
	$(PY) benchmarks/scale_out.py
	$(PY) benchmarks/snippet_threads.py
	$(PY) benchmarks/locate_v1.py
	$(PY) benchmarks/reward_integrity_v1.py

# every library example once, with its default settings (docs/interop.md has the figures)
interop-examples: $(STAMP)
	$(PY) examples/sb3_algorithms.py --algo ppo
	$(PY) examples/sb3_algorithms.py --algo a2c
	$(PY) examples/sb3_algorithms.py --algo dqn
	$(PY) examples/sb3_maskable_ppo.py
	$(PY) examples/torchrl_ppo.py
	$(PY) examples/tianshou_ppo.py
	$(PY) examples/cleanrl_ppo.py

rllib-venv: $(RLLIB_STAMP)

$(RLLIB_STAMP): pyproject.toml constraints-rllib.txt
	test -x $(RLLIB_PY) || $(PYTHON) -m venv $(RLLIB_VENV)
	$(RLLIB_PY) -m pip install -q --upgrade pip
	$(RLLIB_PY) -m pip install -q -c constraints-rllib.txt -e ".[rllib]" pytest
	touch $(RLLIB_STAMP)

# RLlib PPO with action masking (examples/rllib_ppo.py), in .venv-rllib; not part of `make test`
rllib: $(RLLIB_STAMP)
	$(RLLIB_PY) examples/rllib_ppo.py

test-rllib: $(RLLIB_STAMP)
	$(RLLIB_PY) -m pytest tests/test_interop_rllib.py

trl-venv: $(TRL_STAMP)

$(TRL_STAMP): pyproject.toml constraints-trl.txt environments/bugfix_gym_verifiers/pyproject.toml
	test -x $(TRL_PY) || $(PYTHON) -m venv $(TRL_VENV)
	$(TRL_PY) -m pip install -q --upgrade pip
	$(TRL_PY) -m pip install -q -c constraints-trl.txt -e ".[trl,verifiers]" -e environments/bugfix_gym_verifiers pytest
	touch $(TRL_STAMP)

# SFT on scripted play, then TRL's GRPO with environment_factory=BugFixToolEnv (examples/trl_grpo.py), in .venv-trl;
# saves runs/trl_grpo/grpo/model (bugfix-gym serve serves it) and checks the first batch's dump with strict.
# The time it takes on the 2-core machine: docs/llm_trainers.md ("What it reached")
trl: $(TRL_STAMP)
	PYTHONPATH=. $(TRL_PY) examples/trl_grpo.py --dump runs/trl_grpo/first_batch.jsonl

# the tests that need trl / transformers / tokenizers / verifiers (they skip in .venv), in .venv-trl
test-trl: $(TRL_STAMP)
	$(TRL_PY) -m pytest tests/test_trl.py tests/test_conformance.py tests/test_conformance_layouts.py \
		tests/test_hf_tokens.py tests/test_hf_policy.py tests/test_serve_hf.py tests/test_serve_folder.py \
		tests/test_hf_files.py tests/test_chat_template.py tests/test_adapter_rewards.py tests/test_verifiers.py \
		tests/test_trl_v1.py tests/test_verifiers_v1.py tests/test_serve_v1.py

clean:
	rm -rf $(VENV) $(RLLIB_VENV) $(TRL_VENV) build *.egg-info
