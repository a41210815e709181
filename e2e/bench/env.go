package main

import (
	"bufio"
	"context"
	"database/sql"
	"errors"
	"fmt"
	"net/url"
	"os"
	"runtime"
	"strings"
	"time"

	"github.com/ThreeDotsLabs/watermill"

	"github.com/wmonce/watermill-once/migrate"
	"github.com/wmonce/watermill-once/pgtx"
)

// appName tags the benchmark's PostgreSQL sessions, so the wait sampler sees only them.
const appName = "wmonce-bench"

// preloadConsumer owns the rows that fill processed_messages before the runs.
const preloadConsumer = "bench-preload"

// withAppName sets application_name in a PostgreSQL URL unless it is set already.
func withAppName(databaseURL string) (string, error) {
	u, err := url.Parse(databaseURL)
	if err != nil || (u.Scheme != "postgres" && u.Scheme != "postgresql") {
		// A keyword/value DSN: append the setting.
		if strings.Contains(databaseURL, "application_name") {
			return databaseURL, nil
		}
		return databaseURL + " application_name=" + appName, nil
	}
	q := u.Query()
	if q.Get("application_name") == "" {
		q.Set("application_name", appName)
	}
	u.RawQuery = q.Encode()
	return u.String(), nil
}

// validateBenchSchema refuses schema names that could belong to an application: the harness
// truncates the tables of its schema.
func validateBenchSchema(schema string) error {
	if err := pgtx.ValidateIdentifier("schema", schema); err != nil {
		return err
	}
	if !strings.Contains(schema, "bench") {
		return fmt.Errorf("schema %q: the benchmark truncates the tables of its schema, so its name must contain \"bench\" (default wmonce_bench)", schema)
	}
	return nil
}

// prepareSchema migrates the bench schema, creates the business table, removes what earlier
// (possibly interrupted) runs left, and makes sure processed_messages holds at least preload
// rows of the preload consumer.
func prepareSchema(ctx context.Context, db *sql.DB, schema string, preload int, rebuild bool, out func(string, ...any)) error {
	m, err := migrate.New(db, migrate.Config{Schema: schema}, watermill.NopLogger{})
	if err != nil {
		return err
	}
	if _, err := m.Migrate(ctx, migrate.DirectionUp, nil); err != nil {
		return fmt.Errorf("migrate %s: %w", schema, err)
	}
	if _, err := db.ExecContext(ctx, `CREATE TABLE IF NOT EXISTS `+pgtx.QualifiedName(schema, "bench_effects")+` (
    id         bigserial PRIMARY KEY,
    message_id text      NOT NULL,
    payload    bytea     NOT NULL)`); err != nil {
		return fmt.Errorf("create bench_effects: %w", err)
	}
	if err := cleanSchema(ctx, db, schema); err != nil {
		return err
	}
	if err := dropTopicTables(ctx, db, schema); err != nil {
		return err
	}
	processed := pgtx.QualifiedName(schema, "processed_messages")
	var have int
	if err := db.QueryRowContext(ctx, `SELECT count(*) FROM `+processed+` WHERE consumer = $1`, preloadConsumer).Scan(&have); err != nil {
		return err
	}
	if have >= preload && !rebuild {
		out("processed_messages: reusing %d preloaded rows (-rebuild-preload to rebuild)\n", have)
		return nil
	}
	start := time.Now()
	out("processed_messages: loading %d rows (one INSERT ... SELECT generate_series) ...", preload)
	if _, err := db.ExecContext(ctx, `DELETE FROM `+processed+` WHERE consumer = $1`, preloadConsumer); err != nil {
		return err
	}
	// Keys shaped like random UUIDs, so the claims of the runs land all over the index, as
	// real message ids do.
	if _, err := db.ExecContext(ctx, `INSERT INTO `+processed+` (consumer, message_id, payload_sha256, processed_at)
SELECT $1, md5(g::text)::uuid::text, sha256(int8send(g)), now() - g * interval '1 second'
FROM generate_series(1, $2::bigint) AS g`, preloadConsumer, preload); err != nil {
		return fmt.Errorf("preload processed_messages: %w", err)
	}
	if _, err := db.ExecContext(ctx, `VACUUM ANALYZE `+processed); err != nil {
		return fmt.Errorf("vacuum processed_messages: %w", err)
	}
	out(" %s\n", time.Since(start).Round(time.Millisecond))
	return nil
}

// cleanSchema empties what the variants write (never the preloaded rows).
func cleanSchema(ctx context.Context, db *sql.DB, schema string) error {
	q := func(t string) string { return pgtx.QualifiedName(schema, t) }
	stmts := []string{
		`DELETE FROM ` + q("processed_messages") + ` WHERE consumer <> '` + preloadConsumer + `'`,
		`TRUNCATE ` + q("inbox") + `, ` + q("outbox") + `, ` + q("outbox_offsets") + `, ` + q("outbox_rejected") + `, ` + q("bench_effects"),
	}
	for _, s := range stmts {
		if _, err := db.ExecContext(ctx, s); err != nil {
			return fmt.Errorf("clean bench schema: %w", err)
		}
	}
	return nil
}

// dropTopicTables drops the topic tables that an interrupted run of the SQL broker left in the
// bench schema.
func dropTopicTables(ctx context.Context, db *sql.DB, schema string) error {
	q := func(t string) string { return pgtx.QualifiedName(schema, t) }
	tables, err := topicTables(ctx, db, schema)
	if err != nil {
		return err
	}
	for _, t := range tables {
		if _, err := db.ExecContext(ctx, `DROP TABLE IF EXISTS `+q(t)); err != nil {
			return fmt.Errorf("drop leftover topic table %s: %w", t, err)
		}
	}
	return nil
}

// topicTables lists the SQL broker's topic tables in schema.
func topicTables(ctx context.Context, db *sql.DB, schema string) ([]string, error) {
	rows, err := db.QueryContext(ctx, `SELECT tablename FROM pg_tables WHERE schemaname = $1 AND tablename LIKE 'watermill\_%'`, schema)
	if err != nil {
		return nil, err
	}
	defer rows.Close()
	var tables []string
	for rows.Next() {
		var t string
		if err := rows.Scan(&t); err != nil {
			return nil, err
		}
		tables = append(tables, t)
	}
	return tables, rows.Err()
}

// Machine describes where the figures were measured.
type Machine struct {
	CPUs         int     `json:"cpus"`
	Model        string  `json:"model"`
	MemoryGiB    float64 `json:"memory_gib"`
	GoVersion    string  `json:"go_version"`
	PostgreSQL   string  `json:"postgresql"`
	OS           string  `json:"os"`
	Date         string  `json:"date"`
	LoadAvgStart string  `json:"load_average_start"`
	LoadAvgEnd   string  `json:"load_average_end"`
	Kafka        string  `json:"kafka,omitempty"`
	RabbitMQ     string  `json:"rabbitmq,omitempty"`
}

func describeMachine(ctx context.Context, db *sql.DB) Machine {
	m := Machine{
		CPUs:         runtime.NumCPU(),
		GoVersion:    runtime.Version(),
		Date:         time.Now().UTC().Format(time.RFC3339),
		LoadAvgStart: loadAverage(),
		OS:           runtime.GOOS + "/" + runtime.GOARCH,
	}
	if f, err := os.Open("/proc/cpuinfo"); err == nil {
		s := bufio.NewScanner(f)
		for s.Scan() {
			if k, v, ok := strings.Cut(s.Text(), ":"); ok && strings.TrimSpace(k) == "model name" {
				m.Model = strings.TrimSpace(v)
				break
			}
		}
		f.Close()
	}
	if b, err := os.ReadFile("/proc/meminfo"); err == nil {
		var kb float64
		if _, err := fmt.Sscanf(string(b), "MemTotal: %f kB", &kb); err == nil {
			m.MemoryGiB = float64(int(kb/1024/1024*10+0.5)) / 10
		}
	}
	if b, err := os.ReadFile("/etc/os-release"); err == nil {
		for _, line := range strings.Split(string(b), "\n") {
			if v, ok := strings.CutPrefix(line, "PRETTY_NAME="); ok {
				m.OS = strings.Trim(v, `"`) + " " + m.OS
			}
		}
	}
	var v string
	if err := db.QueryRowContext(ctx, `SHOW server_version`).Scan(&v); err == nil {
		m.PostgreSQL = v
	}
	var fsync, syncCommit string
	if db.QueryRowContext(ctx, `SELECT current_setting('fsync'), current_setting('synchronous_commit')`).Scan(&fsync, &syncCommit) == nil {
		m.PostgreSQL += fmt.Sprintf(" (fsync=%s, synchronous_commit=%s)", fsync, syncCommit)
	}
	return m
}

func loadAverage() string {
	b, err := os.ReadFile("/proc/loadavg")
	if err != nil {
		return ""
	}
	f := strings.Fields(string(b))
	if len(f) < 3 {
		return ""
	}
	return strings.Join(f[:3], " ")
}

// errSkip marks a variant that does not apply to a broker.
var errSkip = errors.New("does not apply")

// ConnBudget records how the harness sized its pool from the server's connection limit.
type ConnBudget struct {
	Max      int `json:"max_connections"`
	Reserved int `json:"reserved"` // superuser_reserved_connections (+ reserved_connections on 16+)
	InUse    int `json:"in_use"`   // client backends when the run started (other clients included)
	Free     int `json:"free"`
	Pool     int `json:"pool"`
}

// connectionBudget reads max_connections and the connections in use, and returns a pool size
// of at most want that leaves room for the harness's connections outside the pool (one LISTEN
// connection per SQL broker, the idle variants' counted pools) and a tenth of the server for
// other clients that connect during the run. Too few free connections for a pool of 26 (one in
// flight) is an error that says so.
func connectionBudget(ctx context.Context, dsn string, want int) (ConnBudget, error) {
	var c ConnBudget
	db, err := pgtx.Open(ctx, dsn, pgtx.PoolConfig{MaxOpenConns: 1})
	if err != nil {
		return c, err
	}
	defer db.Close()
	err = db.QueryRowContext(ctx, `SELECT current_setting('max_connections')::int,
		current_setting('superuser_reserved_connections')::int + coalesce(current_setting('reserved_connections', true)::int, 0),
		(SELECT count(*) FROM pg_stat_activity WHERE backend_type = 'client backend')`).Scan(&c.Max, &c.Reserved, &c.InUse)
	if err != nil {
		return c, fmt.Errorf("read max_connections: %w", err)
	}
	const outsidePool = 10
	c.Free = c.Max - c.Reserved - c.InUse
	c.Pool = min(want, c.Free-outsidePool-c.Max/10)
	if c.Pool < 26 {
		return c, fmt.Errorf("PostgreSQL has %d of %d connections free (%d reserved, %d in use): the harness needs at least %d; stop other clients or raise max_connections", c.Free, c.Max, c.Reserved, c.InUse, 26+outsidePool+c.Max/10)
	}
	return c, nil
}
