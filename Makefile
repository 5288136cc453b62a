# afm-platform — the two commands: `make run` (whole pipeline on the embedded default) and `make test`.
# Both create .venv on first use. On CPU machines torch is pinned to the 2.13.0 CPU wheel first, and
# infra/cpu-constraints.txt keeps it there: pyproject.toml's ranges also admit the GPU image's torch 2.14
# (docs/cluster.md), and no resolver may pull a multi-GB CUDA build here.
PY ?= python3.11
VENV := .venv
BIN := $(VENV)/bin
STAMP := $(VENV)/.installed
CONFIG ?= configs/default.yaml

.PHONY: run test test-fast bench setup stack-up stack-down clean

$(STAMP): pyproject.toml infra/cpu-constraints.txt
	@test -x $(BIN)/python || $(PY) -m venv $(VENV)
	$(BIN)/pip install -q --upgrade pip
	$(BIN)/pip install -q -c infra/cpu-constraints.txt torch
	$(BIN)/pip install -q -c infra/cpu-constraints.txt -e ".[test]"
	@# The code sandbox uses bubblewrap when present (falls back to unshare+setpriv); install it where we can.
	@command -v bwrap >/dev/null || { [ "$$(id -u)" = 0 ] && command -v apt-get >/dev/null && \
	  (apt-get install -y -q bubblewrap >/dev/null 2>&1 || (apt-get update -q >/dev/null 2>&1 && apt-get install -y -q bubblewrap >/dev/null 2>&1)) ; } || \
	  echo "note: bubblewrap not installed; the code sandbox uses its unshare+setpriv fallback"
	@touch $(STAMP)

setup: $(STAMP)

run: $(STAMP)
	$(BIN)/afm pipeline --config $(CONFIG)

# Ray Train tests (SFT, and RL whose learner group is Ray Train) run one file per process: Ray Train's
# controller actor, and actors created after it, are cancelled when earlier tests in the same process already
# started and shut down Ray sessions (seen with ray 2.60).
RAY_TRAIN_TESTS := tests/sft/test_sft_ray.py tests/rl/test_trainer.py tests/rl/test_rl_distributed.py tests/platform/test_sft_run_state.py

# -X faulthandler: a crash anywhere, also after pytest has finished (interpreter exit), prints every thread's
# Python stack instead of a bare "Segmentation fault" (see afm/hard_exit.py). --durations: CI's log names the
# slowest tests, so the suite's time (CI allows 30 min on 2 cores) can be watched.
test: $(STAMP)
	$(BIN)/python -X faulthandler -m pytest -m "not gpu" -q -p no:cacheprovider --durations=15 $(addprefix --ignore=,$(RAY_TRAIN_TESTS))
	for t in $(RAY_TRAIN_TESTS); do $(BIN)/python -X faulthandler -m pytest -m "not gpu" -q -p no:cacheprovider --durations=5 $$t || exit 1; done

test-fast: $(STAMP)
	$(BIN)/python -X faulthandler -m pytest -m "not gpu and not integration and not slow" -q -p no:cacheprovider

bench: $(STAMP)
	@for b in bench/bench_*.py; do echo "== $$b"; $(BIN)/python $$b || exit 1; done

stack-up: $(STAMP)
	$(BIN)/afm stack up

stack-down: $(STAMP)
	$(BIN)/afm stack down

clean:
	rm -rf .afm runs
