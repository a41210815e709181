# Every target here runs in CI (.ci/run) or is a documented convenience.
GO ?= go
SHELL := /bin/bash

# Where the services come from: a Docker engine when one answers, else e2e/services
# (Debian or Ubuntu, as root). Override with SERVICES_VIA=docker|script|none.
SERVICES_VIA ?= $(shell if docker info >/dev/null 2>&1; then echo docker; elif [ "$$(id -u)" = 0 ] && command -v apt-get >/dev/null 2>&1; then echo script; else echo none; fi)

# The repository holds several Go modules (ARCHITECTURE.md, "Modules"): the library at the root,
# e2e/ (end-to-end suites, bench, browser tests), examples/, and the embedded brokers of the demo
# and the tests (internal/embeddedkafka, internal/embeddedpg), joined by go.work. `go test ./...`
# at the root does not enter them, so every target that tests, vets or lints runs once per module,
# with GOWORK=off: each module is built with its own go.mod, as a user gets it. The programs
# (demo, quickstart, bench) run from the root through go.work.
MODULES := . e2e examples internal/embeddedkafka internal/embeddedpg
# in_modules runs its argument in each module's folder, and fails when one fails.
in_modules = set -e; for m in $(MODULES); do echo "== module $$m"; (cd $$m && export GOWORK=off && $(1)); done

# The tests run on the real Kafka 3.9 broker that `make services` starts (docker-compose.yml and
# e2e/services both publish it on 127.0.0.1:9092). KAFKA_SERVICE tells the e2e suite how to
# kill and restart that broker for its broker fault. With KAFKA_BROKERS unset the e2e and examples
# modules run on their embedded kfake; the library's Kafka tests then fail, saying what to start
# (its go.mod does not require kfake; .ci/run's kfake pass serves them one, KAFKA_EMBEDDED=1).
KAFKA_BROKERS ?= 127.0.0.1:9092
KAFKA_SERVICE ?= $(if $(filter docker,$(SERVICES_VIA)),docker,3.9)
KAFKA_ENV = KAFKA_BROKERS=$(KAFKA_BROKERS) KAFKA_SERVICE=$(KAFKA_SERVICE)

.PHONY: test test-only test-short race e2e lint golangci-lint demo quickstart services services-postgres bench migrate-sql measure

# golangci-lint, pinned: .golangci.yml is written for this version. Installed with go install
# into GOPATH/bin (GOBIN if set) when that binary is missing or another version.
GOLANGCI_LINT_VERSION ?= 2.15.0
GOBIN_DIR := $(or $(shell $(GO) env GOBIN),$(shell $(GO) env GOPATH)/bin)
GOLANGCI_LINT := $(GOBIN_DIR)/golangci-lint

# The README's test command: start the services, then run the whole suite.
test: services test-only

# The whole suite, every module, against services that are already running (what CI calls after
# provisioning).
test-only:
	@$(call in_modules,$(KAFKA_ENV) $(GO) test -race -count=1 ./...)

race: test

# The pure unit tests, with no service at all: tests that need PostgreSQL, RabbitMQ, real Kafka or
# Chromium skip under -short (without it they fail, saying what to start). The services are
# pointed at closed ports, Kafka included, so a test that reaches one without skipping fails
# here; tests that start their own embedded Kafka still run. Under 30 s on a warm cache: the
# Dockerfile build and the tests that wait out Sarama's breaker belong to the full suite.
# ./... skips the dot-folder .ci, so the measure tool's own test is named.
test-short:
	DATABASE_URL=postgres://postgres@127.0.0.1:1/test AMQP_URL=amqp://guest:guest@127.0.0.1:1/ \
	  KAFKA_BROKERS=127.0.0.1:1 KAFKA_SERVICE= GOWORK=off \
	  $(GO) test -short -count=1 ./.ci/measure
	@$(call in_modules,DATABASE_URL=postgres://postgres@127.0.0.1:1/test AMQP_URL=amqp://guest:guest@127.0.0.1:1/ \
	  KAFKA_BROKERS=127.0.0.1:1 KAFKA_SERVICE= $(GO) test -short -count=1 ./...)

e2e: services
	cd e2e && GOWORK=off $(KAFKA_ENV) $(GO) test -race -count=1 -v ./...

# gofmt, go vet and golangci-lint with .golangci.yml (installed first if needed) in every module,
# go mod tidy's check that each go.mod lists what its module imports, then the import layers of
# ARCHITECTURE.md against the code (.ci/check-imports).
lint: golangci-lint
	@unformatted=$$(gofmt -l $$(git ls-files '*.go')); \
	if [ -n "$$unformatted" ]; then echo "gofmt needed:"; echo "$$unformatted"; exit 1; fi
	GOWORK=off $(GO) vet ./.ci/measure
	@$(call in_modules,$(GO) vet ./... && $(GO) mod tidy -diff && $(GOLANGCI_LINT) run --config $(CURDIR)/.golangci.yml ./...)
	bash .ci/check-imports

golangci-lint:
	@if [ "$$($(GOLANGCI_LINT) version --short 2>/dev/null)" != "$(GOLANGCI_LINT_VERSION)" ]; then \
	  echo "installing golangci-lint v$(GOLANGCI_LINT_VERSION) into $(GOBIN_DIR)"; \
	  $(GO) install github.com/golangci/golangci-lint/v2/cmd/golangci-lint@v$(GOLANGCI_LINT_VERSION); \
	else echo "golangci-lint v$(GOLANGCI_LINT_VERSION) is installed ($(GOLANGCI_LINT))"; fi

# The demo needs PostgreSQL only (Kafka is embedded when KAFKA_BROKERS is unset, see BROKER).
demo: services-postgres
	$(GO) run ./examples/payments

quickstart: services-postgres
	$(GO) run ./examples/quickstart

# promtool is a tool, not a service: Debian's prometheus package, installed for ops/metrics's
# test of ops/deploy, its server never started.
services:
	@$(MAKE) --no-print-directory services-up WHAT="postgres pg-restore rabbitmq chromium promtool kafka connect"

services-postgres:
	@$(MAKE) --no-print-directory services-up WHAT=postgres

services-up:
ifeq ($(SERVICES_VIA),docker)
	docker compose up -d --wait $(patsubst connect,connect-1 connect-2,$(filter-out chromium promtool pg-restore,$(WHAT)))
	@if echo "$(WHAT)" | grep -q chromium && ! command -v chromium >/dev/null 2>&1; then \
	  echo "Chromium is missing: the admin page's browser test needs it (Debian: apt-get install chromium)"; exit 1; fi
	@if echo "$(WHAT)" | grep -q promtool && ! command -v promtool >/dev/null 2>&1; then \
	  echo "promtool is missing: ops/metrics's test of ops/deploy needs it (Debian: apt-get install --no-install-recommends prometheus)"; exit 1; fi
else ifeq ($(SERVICES_VIA),script)
	bash e2e/services up $(WHAT)
else
	@if ! (exec 3<>/dev/tcp/127.0.0.1/5432) 2>/dev/null; then \
	  echo "Cannot start the services here: no Docker engine answers and this is not Debian/Ubuntu as root."; \
	  echo "Start them yourself ($(WHAT); see docs/services.md), then run this again."; exit 1; fi
endif

# BENCH_ARGS=-quick for a short run; see go run ./e2e/bench -h.
bench:
	$(GO) run ./e2e/bench $(BENCH_ARGS)

migrate-sql:
	@$(GO) run ./cmd/wmonce migrate print

# The indicators issue 36 compares codebases by (lines, go doc lines, exported names, Default
# constants, go.mod requirements, cyclomatic complexity), offline. MEASURE_DIR measures another
# checkout with the same counting; MEASURE_ARGS passes flags (-exclude dev for Watermill, -top N).
MEASURE_DIR ?= .
measure:
	@$(GO) run ./.ci/measure $(MEASURE_ARGS) $(MEASURE_DIR)
