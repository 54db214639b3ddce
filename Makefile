# Twinstream developer entry points. `make up` and `make test` install everything first.
SHELL := /bin/bash
.SHELLFLAGS := -eu -o pipefail -c
.DEFAULT_GOAL := help

PYTHON ?= python3.11
VENV := .venv
BIN := $(abspath $(VENV))/bin
JARS := $(abspath .twinstream/jars)
PYSPARK_PIN := $(shell sed -n 's/^pyspark==//p' requirements.txt)
MVN := mvn -B -s java/settings.xml -f java/pom.xml

# The virtualenv's bin first: Airflow calls `airflow`, Spark providers call `spark-submit`.
export PATH := $(BIN):$(PATH)
export PYSPARK_PYTHON := $(BIN)/python
export TWINSTREAM_JARS_DIR ?= $(JARS)

.PHONY: help install system-deps up status down test lint typecheck unit dags integration constraints clean

help:
	@echo "make up      install everything and start the local stack (ZooKeeper, Kafka x3, Airflow)"
	@echo "make status  show every service of the stack and its pid"
	@echo "make down    stop everything the stack started"
	@echo "make test    install everything and run lint, type checks and all tests"
	@echo "make clean   stop the stack and delete its state (.twinstream/) and the virtualenv"

install: system-deps $(VENV)/.installed $(JARS)/.installed

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

$(VENV)/.installed: requirements.txt constraints.txt pyproject.toml
	@echo "== installing Python packages into $(VENV)"
	$(PYTHON) -m venv $(VENV)
	$(BIN)/pip install --progress-bar off -r requirements.txt -c constraints.txt
	@# apache-airflow-providers-apache-spark pulls pyspark-client, which overwrites pyspark's
	@# Python files with an older version; put pyspark's own back.
	$(BIN)/pip install --progress-bar off -q --force-reinstall --no-deps pyspark==$(PYSPARK_PIN)
	$(BIN)/pip install --progress-bar off -q --no-deps -e .
	$(BIN)/python -c 'import pyspark, sys; v = pyspark.__version__; sys.exit(0 if v == "$(PYSPARK_PIN)" else f"pyspark is {v}, want $(PYSPARK_PIN)")'
	@touch $@

$(JARS)/.installed: java/pom.xml java/settings.xml java/kafka/pom.xml java/zookeeper/pom.xml java/spark-kafka/pom.xml
	@echo "== fetching jars from Maven Central into $(JARS)"
	rm -rf $(JARS)
	$(MVN) package -Dtwinstream.jars=$(JARS)
	@touch $@

up: install
	$(BIN)/twinstream-stack up

status:
	@$(BIN)/twinstream-stack status

down:
	@if [ -x $(BIN)/twinstream-stack ]; then $(BIN)/twinstream-stack down; else echo "nothing installed, nothing running"; fi

lint: install
	$(BIN)/ruff check .
	$(BIN)/ruff format --check .

typecheck: install
	$(BIN)/mypy

unit: install
	$(BIN)/pytest tests/unit

dags: install
	$(BIN)/pytest tests/dags

integration: install
	$(BIN)/pytest tests/integration

test: install
	$(BIN)/ruff check .
	$(BIN)/ruff format --check .
	$(BIN)/mypy
	$(BIN)/pytest tests/unit tests/dags tests/integration

# Re-pin every transitive dependency after changing requirements.txt.
constraints: $(VENV)/.installed
	$(BIN)/pip freeze --exclude-editable --exclude twinstream > constraints.txt

clean: down
	rm -rf .twinstream $(VENV)
