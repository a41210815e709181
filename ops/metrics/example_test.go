package metrics_test

import (
	"database/sql"
	"net/http"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/promhttp"

	"github.com/wmonce/watermill-once/effects/intent"
	"github.com/wmonce/watermill-once/middleware/httpidem"
	"github.com/wmonce/watermill-once/middleware/once"
	"github.com/wmonce/watermill-once/ops/metrics"
	"github.com/wmonce/watermill-once/ops/retention"
	"github.com/wmonce/watermill-once/outbox"
)

// Register every component of the process once, then serve the registry.
func ExampleRegister() {
	var (
		db      *sql.DB              // pgtx.Open(...)
		mw      *once.Middleware     // once.New(...)
		relay   *outbox.Relay        // outbox.NewRelay(...)
		janitor *retention.Janitor   // retention.NewJanitor(...)
		sender  *intent.Sender       // intent.NewSender(...)
		idem    *httpidem.Middleware // httpidem.NewMiddleware(...)
	)
	reg := prometheus.NewRegistry()
	if err := metrics.Register(reg, metrics.Sources{
		DB:              db,
		Schema:          "wmonce",
		Middlewares:     []*once.Middleware{mw},
		Relays:          []*outbox.Relay{relay},
		Janitors:        []*retention.Janitor{janitor},
		Senders:         []*intent.Sender{sender},
		HTTPIdempotency: []*httpidem.Middleware{idem},
	}); err != nil {
		panic(err) // only an invalid schema name or a second registration fail
	}
	http.Handle("/metrics", promhttp.HandlerFor(reg, promhttp.HandlerOpts{}))
	_ = http.ListenAndServe(":9090", nil)
}
