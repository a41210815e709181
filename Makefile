# Every target here runs in CI (.ci/run) or is a documented convenience.
GO ?= go

.PHONY: test race e2e lint demo quickstart services bench migrate-sql

# The README's test command.
test:
	$(GO) test -race -count=1 ./...

race: test

e2e:
	$(GO) test -race -count=1 -v ./e2e/...

lint:
	@unformatted=$$(gofmt -l $$(git ls-files '*.go')); \
	if [ -n "$$unformatted" ]; then echo "gofmt needed:"; echo "$$unformatted"; exit 1; fi
	$(GO) vet ./...

demo:
	$(GO) run ./examples/payments

quickstart:
	$(GO) run ./examples/quickstart

# For machines without local services: PostgreSQL, Kafka and RabbitMQ in Docker.
services:
	docker compose up -d postgres kafka rabbitmq

# BENCH_ARGS=-quick for a short run; see go run ./bench -h.
bench:
	$(GO) run ./bench $(BENCH_ARGS)

migrate-sql:
	@$(GO) run ./cmd/wmonce migrate print
