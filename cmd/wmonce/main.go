// Command wmonce is the operator's tool for watermill-once: it migrates the schema, shows
// what the consumers, the inbox and the outbox are doing, replays or skips parked inbox rows,
// answers "was this message processed, and when?", purges old dedupe records and serves the
// admin page.
//
// Usage:
//
//	wmonce [-database-url URL] [-schema NAME] [-json] <command> [flags]
//
// Commands:
//
//	migrate up|down|print|baseline|version
//	                                create, upgrade, revert, print or record the schema
//	status                          schema version, consumers, inbox and outbox at a glance
//	inbox stats|list|inspect|replay|skip|unpark
//	                                look at and act on inbox rows
//	outbox [stats|rejected|inspect|republish|forget]
//	                                relays' backlog, lag and held topics; rejected rows;
//	                                forget a retired relay
//	dedupe -consumer C -message M   was message M processed by consumer C, and when
//	purge                           delete dedupe records older than a cutoff
//	admin                           serve the admin page and its JSON API
//	help [command]                  explain a command, with examples
//
// The database comes from -database-url, else DATABASE_URL, else
// postgres://postgres@127.0.0.1:5432/test?sslmode=disable. Global flags may also follow the
// command (`wmonce status -schema payments`). -json prints machine-readable output.
//
// Exit codes: 0 success, 1 failure (the message says what to fix), 2 usage error, 3 (doctor
// only) no hazard found but a source could not be checked.
package main

import (
	"context"
	"os"
	"os/signal"
	"syscall"
)

func main() {
	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
	code := run(ctx, os.Args[1:], os.Stdout, os.Stderr)
	stop()
	os.Exit(code)
}
