# EAI Tool Gateway. `make run` serves the demo on 127.0.0.1:8000; `make test` runs the suite.
PYTHON ?= python3
VENV := .venv
BIN := $(VENV)/bin
STAMP := $(VENV)/.installed

.PHONY: run test lint bench install migrate demo serve messages clean image sdk sdk-build openapi

$(BIN)/python:
	$(PYTHON) -m venv $(VENV)

# Reinstall only when the lock file or a package definition changed.
$(STAMP): $(BIN)/python requirements.lock pyproject.toml sdk/python/pyproject.toml
	$(BIN)/python -m pip install --quiet --upgrade pip
	$(BIN)/python -m pip install --quiet -r requirements.lock
	$(BIN)/python -m pip install --quiet --no-deps -e sdk/python
	touch $(STAMP)

install: $(STAMP)

migrate: install
	$(BIN)/python manage.py migrate --noinput

demo: migrate
	$(BIN)/python manage.py demo

run: demo
	$(BIN)/python manage.py serve

test: install
	$(BIN)/python -m pytest -q

# Load benchmark of the invoke path on PostgreSQL + Redis (127.0.0.1), gunicorn and hey;
# installs hey if missing, recreates the eai_bench database. See BENCHMARKS.md.
bench: install
	$(BIN)/python bench/run.py

# The container image (deploy/Containerfile) built here from Debian's packages, no
# registry needed: needs root, buildah and debootstrap. See README, "Deploy".
image: install
	bash deploy/build-image.sh

# The four SDKs (sdk/python, sdk/typescript, sdk/go, sdk/java): build only, then build and
# test them against a gateway started on a free port with a temporary database.
# Regenerate the committed OpenAPI document (the TypeScript SDK's types come from it).
openapi: install
	$(BIN)/python manage.py spectacular --format openapi-json --file contracts/v1/openapi.json

sdk-build: install
	bash sdk/testing/build-all.sh

sdk: sdk-build
	$(BIN)/python sdk/testing/gateway.py -- bash sdk/testing/test-all.sh

lint: install
	$(BIN)/ruff check .
	$(BIN)/ruff format --check .

# Recompile the French catalogue after editing locale/fr/LC_MESSAGES/django.po
# (needs gettext's msgfmt; the compiled .mo is committed for machines without it).
messages: install
	$(BIN)/python manage.py compilemessages -l fr

clean:
	rm -rf $(VENV) db.sqlite3 db.sqlite3-wal db.sqlite3-shm staticfiles
