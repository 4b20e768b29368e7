# Convenience targets; each one bootstraps .venv first (scripts/bootstrap).
PY := .venv/bin/python

.PHONY: serve test lint format bench duplicates

serve:
	scripts/serve

test:
	scripts/test

lint:
	scripts/bootstrap test && .venv/bin/ruff check . && .venv/bin/ruff format --check .

format:
	.venv/bin/ruff format . && .venv/bin/ruff check --fix .

bench:
	scripts/bootstrap test
	@for script in benchmarks/bench_*.py; do echo "== $$script"; $(PY) $$script || exit 1; done

duplicates:
	duplicates --most 40
