package main

import (
	"context"
	"errors"
	"fmt"
	"net"
	"net/http"
	"time"

	"github.com/ThreeDotsLabs/watermill"

	"github.com/wmonce/watermill-once/ops/admin"
)

// The admin server's limits: a client has adminReadHeaderTimeout to send its request headers,
// and a stop waits adminShutdownTimeout for the requests under way.
const (
	adminReadHeaderTimeout = 10 * time.Second
	adminShutdownTimeout   = 5 * time.Second
)

func adminCommand() *command {
	return &command{
		name:    "admin",
		summary: "serve the admin page and its JSON API",
		usage:   "admin [-addr 127.0.0.1:8089] [-allow-writes]",
		details: `
Serves the page of package admin (charts of claims per consumer, inbox backlog and relay lag;
the inbox by status with replay and skip; rejected outbox rows) until interrupted. It is
read-only unless -allow-writes is given. It authenticates no one: keep it on a loopback or
otherwise protected address. Claims and the duplicates chart come from the database (every
process's); the table's fresh, duplicate and failure counts are the middlewares' in-process
counts, so they appear only when the handler is mounted in the service itself
(admin.NewHandler with Config.Middlewares). Backlog and lag charts come from samples this command takes while it
runs (every 15 s), so they start empty.`,
		examples: []string{
			"wmonce admin",
			"wmonce admin -addr 127.0.0.1:9000 -allow-writes",
		},
		run: runAdmin,
	}
}

func runAdmin(ctx context.Context, e *env, args []string) error {
	fs := e.flags("admin")
	addr := fs.String("addr", "127.0.0.1:8089", "address to listen on")
	allowWrites := fs.Bool("allow-writes", false, "enable replay and skip")
	db, err := e.parseAndOpen(ctx, fs, args)
	if err != nil {
		return err
	}
	h, err := admin.NewHandler(db, admin.Config{Schema: e.g.schema, AllowWrites: *allowWrites}, watermill.NewStdLoggerWithOut(e.stderr, false, false))
	if err != nil {
		return err
	}
	defer h.Close() // stops the sampling behind the page's charts
	ln, err := (&net.ListenConfig{}).Listen(ctx, "tcp", *addr)
	if err != nil {
		return fmt.Errorf("cannot listen on %s: %w (pick another address with -addr)", *addr, err)
	}
	srv := &http.Server{Handler: h, ReadHeaderTimeout: adminReadHeaderTimeout}
	mode := "read-only"
	if *allowWrites {
		mode = "writes enabled"
	}
	fmt.Fprintf(e.stdout, "serving the admin page for schema %s (%s) on http://%s/\n", e.g.schema, mode, ln.Addr())
	done := make(chan error, 1)
	go func() { done <- srv.Serve(ln) }()
	select {
	case err := <-done:
		return err
	case <-ctx.Done():
	}
	shutdownCtx, cancel := context.WithTimeout(context.Background(), adminShutdownTimeout)
	defer cancel()
	if err := srv.Shutdown(shutdownCtx); err != nil {
		return err
	}
	if err := <-done; err != nil && !errors.Is(err, http.ErrServerClosed) {
		return err
	}
	return nil
}
