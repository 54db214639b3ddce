# Twinstream developer entry points. `make up` and `make test` install everything first.
SHELL := /bin/bash
.SHELLFLAGS := -eu -o pipefail -c
.DEFAULT_GOAL := help

PYTHON ?= python3.11
VENV := .venv
BIN := $(abspath $(VENV))/bin
# Debian's chromium (make browser).
CHROMIUM := /usr/bin/chromium
JARS := $(abspath .twinstream/jars)
PYSPARK_PIN := $(shell sed -n 's/^pyspark==//p' requirements.txt)
AIRFLOW_PIN := $(shell sed -n 's/^apache-airflow==//p' requirements.txt)
MVN := mvn -B -s java/settings.xml -f java/pom.xml

# The virtualenv's bin first: Airflow calls `airflow`, Spark providers call `spark-submit`.
export PATH := $(BIN):$(PATH)
export PYSPARK_PYTHON := $(BIN)/python
export TWINSTREAM_JARS_DIR ?= $(JARS)

.PHONY: help install system-deps browser airflow-db up status restart down check test lint typecheck unit dags integration chaos screenshots constraints clean

help:
	@echo "make up      install everything and start the local stack (ZooKeeper, Kafka x3, Airflow)"
	@echo "make status  show every service of the stack and its pid"
	@echo "make restart ENGINE=a  restart one engine and wait until it is healthy again"
	@echo "make down    stop everything the stack started"
	@echo "make check   the inner loop (under 3 minutes): ruff, ruff format --check, mypy,"
	@echo "             the unit and DAG tests; no service started"
	@echo "make test    install everything; make check, then every test of tests/integration"
	@echo "             on a test stack of their own (tests/chaos collected, all skipped)"
	@echo "make chaos   tests/chaos: the scenarios of minutes (100 kill -9 failovers, a broker"
	@echo "             killed, ZooKeeper down 30 s and its leader killed, the inbound leader lost,"
	@echo "             a 3-minute outbound outage, a double kill under supervisord, a warm spare,"
	@echo "             a quarantine and an audit over three partitions, a restore through Airflow,"
	@echo "             the drill, two pipelines, three engines, standbys behind and far ahead,"
	@echo "             damaged snapshots, a standalone cluster, up after down, deploys)"
	@echo "make clean   stop the stack and delete its state (.twinstream/) and the virtualenv"

# The Python packages, the jars and, for the targets that drive a browser, Debian's
# Chromium (INSTALL_ALSO) side by side: on a fresh machine each is mostly downloads, and
# one after the other they took minutes. Their lines interleave as they come (make's
# --output-sync would hold each command's output until it ends: minutes without a line).
# The class archive is a target of the same make, so it starts as soon as the packages
# and the jars are there, and `make up`'s Airflow database (INSTALL_ALSO) as soon as the
# packages are, while Maven may still be fetching.
install: system-deps
	@$(MAKE) --no-print-directory -j3 $(JARS)/spark-classes.jsa $(INSTALL_ALSO)

# Java 17 and Maven come from Debian where they are missing (CI machines are Debian).
system-deps:
	@if ! command -v java >/dev/null || ! command -v mvn >/dev/null || ! command -v $(PYTHON) >/dev/null; then \
	  if command -v apt-get >/dev/null && [ "$$(id -u)" = 0 ]; then \
	    echo "installing Java 17 and Maven from Debian"; \
	    apt-get update -q && apt-get install -y -q openjdk-17-jdk-headless maven; \
	  else \
	    echo "need $(PYTHON), java (17+) and mvn on PATH" >&2; exit 1; \
	  fi; \
	fi
	@java -version 2>&1 | head -1 | grep -qE '"(1[7-9]|[2-9][0-9])' || { echo "Java 17 or newer is required: $$(java -version 2>&1 | head -1)" >&2; exit 1; }
	@command -v $(PYTHON) >/dev/null || { echo "$(PYTHON) is required" >&2; exit 1; }

# uv (Astral's installer, from PyPI) downloads and installs the ~180 pinned packages in
# parallel, where pip fetched them one by one: pip took most of a fresh `make install`.
# It goes into the virtualenv by pip (one wheel), which stays there for `pip check` and
# for the fallback: without uv (no wheel for this platform, no network to its file) pip
# installs the same pins, only slower.
UV_VERSION := 0.13.9

$(VENV)/.installed: requirements.txt constraints.txt pyproject.toml
	@echo "== installing Python packages into $(VENV)"
	$(PYTHON) -m venv $(VENV)
	@# apache-airflow-providers-apache-spark pulls pyspark-client, which overwrites pyspark's
	@# Python files with an older version; put pyspark's own back (uv: by uninstall and
	@# install, as its --reinstall would also rebuild pyspark's wheel, a minute, every time).
	@if $(BIN)/pip install --progress-bar off -q uv==$(UV_VERSION); then \
	  uv="$(BIN)/uv pip"; python="--python $(BIN)/python"; \
	  echo "$$uv install $$python -r requirements.txt -c constraints.txt"; \
	  $$uv install $$python -r requirements.txt -c constraints.txt; \
	  $$uv uninstall $$python -q pyspark; \
	  $$uv install $$python -q --no-deps pyspark==$(PYSPARK_PIN); \
	  $$uv install $$python -q --no-deps -e .; \
	else \
	  echo "== uv $(UV_VERSION) could not be installed (see above): installing with pip, which takes minutes longer"; \
	  pip="$(BIN)/pip install --progress-bar off"; \
	  echo "$$pip -r requirements.txt -c constraints.txt"; \
	  $$pip -r requirements.txt -c constraints.txt; \
	  $$pip -q --force-reinstall --no-deps pyspark==$(PYSPARK_PIN); \
	  $$pip -q --no-deps -e .; \
	fi
	$(BIN)/python -c 'import pyspark, sys; v = pyspark.__version__; sys.exit(0 if v == "$(PYSPARK_PIN)" else f"pyspark is {v}, want $(PYSPARK_PIN)")'
	@touch $@

# The classes a Spark driver loads, archived once for every JVM start after (twinstream.engine.archive):
# rebuilt whenever pyspark or the jars change, since the JVM refuses a stale archive.
$(JARS)/spark-classes.jsa: $(VENV)/.installed $(JARS)/.installed
	@echo "== archiving Spark's classes for fast engine starts (JDK class data sharing)"
	$(BIN)/python -m twinstream.engine.archive

$(JARS)/.installed: java/pom.xml java/settings.xml java/kafka/pom.xml java/zookeeper/pom.xml java/spark-kafka/pom.xml \
		java/kafka-streams/pom.xml java/flink/pom.xml java/baseline-common/pom.xml java/profiler/pom.xml $(wildcard java/*/src/main/java/io/twinstream/baseline/*.java)
	@echo "== fetching jars from Maven Central into $(JARS)"
	rm -rf $(JARS)
	$(MVN) package -Dtwinstream.jars=$(JARS)
	@touch $@

# Airflow's database, created beside the jars and the class archive rather than by
# Airflow's start inside `up`, where it ran beside every JVM's start (twinstream.stack.launch).
# Nothing to do once it is at the installed Airflow's version: the stamp is checked in the
# shell first, so a second `make up` starts no Python for it (9 s on a loaded machine);
# whenever the shell cannot tell, launch decides.
airflow-db: $(VENV)/.installed
	@stamp="$${TWINSTREAM_STATE_DIR:-$(CURDIR)/.twinstream}/airflow/.migrated-to"; \
	  [ "$$(cat "$$stamp" 2>/dev/null)" = "$(AIRFLOW_PIN)" ] || \
	  $(BIN)/python -m twinstream.stack.launch airflow-db

up: INSTALL_ALSO := airflow-db
up: install
	$(BIN)/twinstream-stack up

status:
	@$(BIN)/twinstream-stack status

# One engine of the running stack (twinstream.stack.restart); `make status` lists them.
restart:
	@[ -n "$(ENGINE)" ] || { echo "make restart ENGINE=<id>: give the engine's id (make status lists them)" >&2; exit 2; }
	@$(BIN)/twinstream restart $(ENGINE)

down:
	@if [ -x $(BIN)/twinstream-stack ]; then $(BIN)/twinstream-stack down; else echo "nothing installed, nothing running"; fi

lint: install
	$(BIN)/ruff check .
	$(BIN)/ruff format --check .

typecheck: install
	$(BIN)/mypy

unit: install
	$(BIN)/pytest tests/unit pipelines

dags: install
	$(BIN)/pytest tests/dags

integration: INSTALL_ALSO := browser
integration: install
	$(BIN)/pytest tests/integration

# tests/chaos whole: the scenarios of minutes, every one marked chaos_only, which `make
# test` collects and skips (each module names what make test proves of its guarantee: make
# test keeps to CI's 40 minutes). `-s`: the run takes over an hour, so each failover's line is shown as it happens (and kept: pytest would drop a
# passing test's captured output).
chaos: install
	TWINSTREAM_CHAOS_FAILOVERS=100 TWINSTREAM_CHAOS_FULL=1 \
	  $(BIN)/pytest -s --durations=0 tests/chaos

# The inner loop: lint, types, the unit and DAG tests, no service started (the unit tests
# check the fetched jars, so those come first). mypy (one core, ~40 s from a cold cache)
# runs beside the unit and DAG tests (one core, ~70 s) on CI's two cores, its report
# printed after theirs. BESIDE: a target built beside them too (`make test` passes Spark's
# class archive, a JVM on one core, ~60 s, which only the integration tests need: built
# first with the rest of the install, it held the unit tests back that long).
check: system-deps
	@$(MAKE) --no-print-directory -j2 $(VENV)/.installed $(JARS)/.installed
	$(BIN)/ruff check .
	$(BIN)/ruff format --check .
	@typecheck=$$(mktemp); beside=$$(mktemp); built=0; \
	  if [ -n "$(BESIDE)" ]; then $(MAKE) --no-print-directory $(BESIDE) >"$$beside" 2>&1 & built=$$!; fi; \
	  $(BIN)/mypy >"$$typecheck" 2>&1 & mypy=$$!; \
	  status=0; $(BIN)/pytest --durations=15 tests/unit tests/dags pipelines || status=$$?; \
	  typed=0; wait $$mypy || typed=$$?; \
	  echo "== mypy"; cat "$$typecheck"; rm -f "$$typecheck"; \
	  made=0; if [ $$built -ne 0 ]; then wait $$built || made=$$?; fi; \
	  cat "$$beside"; rm -f "$$beside"; \
	  if [ $$typed -ne 0 ] || [ $$status -ne 0 ] || [ $$made -ne 0 ]; then exit 1; fi

# `make check`, then tests/integration and tests/chaos on a test stack of their own
# (tests/conftest.py), on an idle machine: they time failovers. Every scenario of
# tests/chaos is chaos_only, collected and skipped (`make chaos` runs them; a unit test,
# tests/unit/test_suites.py, keeps every chaos_only test there and none elsewhere). pytest lists each setup,
# scenario and teardown of 5 s or more: where the suite's time budget goes, every run.
test: INSTALL_ALSO := browser
test: system-deps
	@$(MAKE) --no-print-directory -j3 $(VENV)/.installed $(JARS)/.installed $(INSTALL_ALSO)
	@$(MAKE) --no-print-directory check BESIDE=$(JARS)/spark-classes.jsa
	$(BIN)/pytest --durations=0 --durations-min=5 tests/integration tests/chaos

# Headless Chromium, from Debian (playwright's own browser download is not used): the
# operator page's integration test and `make screenshots` drive it through playwright.
browser:
	@if [ ! -x $(CHROMIUM) ]; then \
	  if command -v apt-get >/dev/null && [ "$$(id -u)" = 0 ]; then \
	    echo "installing chromium from Debian"; \
	    apt-get update -q && apt-get install -y -q chromium; \
	  else \
	    echo "need $(CHROMIUM) (Debian's chromium package: apt-get install chromium)" >&2; exit 1; \
	  fi; \
	fi

# Screenshots of the Airflow UI for the README; the stack must be up (`make up`).
screenshots: INSTALL_ALSO := browser
screenshots: install
	$(BIN)/python docs/screenshots.py

# Re-pin every transitive dependency after changing requirements.txt.
constraints: $(VENV)/.installed
	{ echo "# Every transitive dependency, pinned. Generated by \`make constraints\`; do not edit."; \
	  $(BIN)/pip freeze --exclude-editable --exclude twinstream --exclude uv; } > constraints.txt

clean: down
	rm -rf .twinstream $(VENV)
