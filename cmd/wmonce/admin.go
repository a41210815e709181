package main

import (
	"context"
	"errors"
	"flag"
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
		actions: []action{{db: (*env).openMigrated, new: newAdminServer}},
	}
}

// adminServer is `wmonce admin`.
type adminServer struct {
	addr        string
	allowWrites bool
}

func newAdminServer(fs *flag.FlagSet) runner {
	a := &adminServer{}
	fs.StringVar(&a.addr, "addr", "127.0.0.1:8089", "address to listen on")
	fs.BoolVar(&a.allowWrites, "allow-writes", false, "enable replay and skip")
	return a
}

func (a *adminServer) run(ctx context.Context, e *env) error {
	h, err := admin.NewHandler(e.db, admin.Config{Schema: e.g.schema, AllowWrites: a.allowWrites}, watermill.NewStdLoggerWithOut(e.stderr, false, false))
	if err != nil {
		return err
	}
	defer h.Close() // stops the sampling behind the page's charts
	ln, err := (&net.ListenConfig{}).Listen(ctx, "tcp", a.addr)
	if err != nil {
		return fmt.Errorf("cannot listen on %s: %w (pick another address with -addr)", a.addr, err)
	}
	mode := map[bool]string{false: "read-only", true: "writes enabled"}[a.allowWrites]
	fmt.Fprintf(e.stdout, "serving the admin page for schema %s (%s) on http://%s/\n", e.g.schema, mode, ln.Addr())
	return serveUntilDone(ctx, &http.Server{Handler: h, ReadHeaderTimeout: adminReadHeaderTimeout}, ln)
}

// serveUntilDone serves on ln until the server fails or ctx is done; then it waits
// adminShutdownTimeout for the requests under way.
func serveUntilDone(ctx context.Context, srv *http.Server, ln net.Listener) error {
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
	if err := <-done; !errors.Is(err, http.ErrServerClosed) {
		return err
	}
	return nil
}
