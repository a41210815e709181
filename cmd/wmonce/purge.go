package main

import (
	"cmp"
	"context"
	"database/sql"
	"flag"
	"fmt"
	"sort"
	"strconv"
	"strings"
	"time"

	"github.com/ThreeDotsLabs/watermill"

	"github.com/wmonce/watermill-once/internal/operate"
	"github.com/wmonce/watermill-once/ops/retention"
)

func purgeCommand() *command {
	return &command{
		name:    "purge",
		summary: "delete dedupe claims older than a cutoff, or run one janitor round",
		usage: `
purge (-consumer C | -all) (-before DATE | -older-than AGE) [-dry-run] [-batch-size N]
purge -janitor -keep AGE [-inbox-keep AGE] [-outbox-keep AGE] [-cdc-slots S,...] [-batch-size N]`,
		details: `
The first form deletes effectively-once claims (processed_messages and its daily partitions)
of one consumer, or of every consumer with -all, applied before the cutoff, in batches of
short transactions (retention.Purge). -before takes a date (2026-11-01, midnight UTC) or an
RFC 3339 time; -older-than an age (720h, 30d) counted back from the database clock. A cutoff
in the future is refused. -dry-run only counts.

A purged claim no longer deduplicates: a copy of its message that arrives later is applied
again, unless the middleware's age guard (MaxMessageAge) refuses it. Purge only what no broker
can redeliver any more.

-janitor runs one round of the retention janitor (retention.Janitor.RunOnce) with the windows
given here: claims older than -keep, finished inbox rows older than -inbox-keep (default:
-keep) and relayed outbox rows older than -outbox-keep (default 24h). Give the windows your
services' janitor uses. It runs beside a janitor service safely. The positions of the
replication slots of Debezium connectors reading the outbox (registered by wmonce connector
apply) first move up to what each slot has confirmed, so the rows Debezium delivered can go;
-cdc-slots names slots whose positions must be registered (retention.Config.CDCSlots).`,
		examples: []string{
			"wmonce purge -consumer rewards -older-than 30d -dry-run",
			"wmonce purge -consumer rewards -before 2026-11-01",
			"wmonce purge -all -older-than 2160h",
			"wmonce purge -janitor -keep 168h",
		},
		actions: []action{{db: (*env).openMigrated, new: newPurge}},
	}
}

// purge is `wmonce purge`: of claims, or with -janitor one janitor round.
type purge struct {
	consumer, before, olderThan           string
	all, dryRun, janitor                  bool
	batch                                 int
	keep, inboxKeep, outboxKeep, cdcSlots string

	age    time.Duration // -older-than
	cutoff time.Time     // -before
	cfg    retention.Config
}

func newPurge(fs *flag.FlagSet) runner {
	p := &purge{}
	fs.StringVar(&p.consumer, "consumer", "", "consumer whose claims go")
	fs.BoolVar(&p.all, "all", false, "purge the claims of every consumer")
	fs.StringVar(&p.before, "before", "", "delete claims applied before this date (2026-11-01, UTC) or RFC 3339 time")
	fs.StringVar(&p.olderThan, "older-than", "", "delete claims older than this age (e.g. 720h or 30d), by the database clock")
	fs.BoolVar(&p.dryRun, "dry-run", false, "count what would be deleted, delete nothing")
	fs.IntVar(&p.batch, "batch-size", 0, "rows per delete transaction (default "+strconv.Itoa(retention.DefaultBatchSize)+")")
	fs.BoolVar(&p.janitor, "janitor", false, "run one retention janitor round instead (needs -keep)")
	fs.StringVar(&p.keep, "keep", "", "janitor: retention window of claims (e.g. 168h or 7d)")
	fs.StringVar(&p.inboxKeep, "inbox-keep", "", "janitor: retention of finished inbox rows (default: -keep)")
	fs.StringVar(&p.outboxKeep, "outbox-keep", "", "janitor: retention of relayed outbox rows (default 24h)")
	fs.StringVar(&p.cdcSlots, "cdc-slots", "", "janitor: comma-separated replication slots of Debezium connectors whose outbox positions must be registered (registered ones are advanced anyway)")
	return p
}

func (p *purge) check([]string) error {
	err := usageIf(p.batch < 0 || p.batch > retention.MaxBatchSize, "-batch-size must be between 1 and %d", retention.MaxBatchSize)
	if p.janitor {
		return operate.FirstError(err,
			usageIf(p.consumer != "" || p.all || p.before != "" || p.olderThan != "" || p.dryRun,
				"-janitor runs the janitor's own windows: it takes -keep, -inbox-keep, -outbox-keep, -cdc-slots and -batch-size, not -consumer, -all, -before, -older-than or -dry-run"),
			p.checkJanitor())
	}
	return operate.FirstError(err, p.checkClaims())
}

// checkClaims checks the flags of a purge of claims and reads its age (-older-than) or cutoff
// (-before).
func (p *purge) checkClaims() error {
	err := operate.FirstError(
		usageIf(p.keep != "" || p.inboxKeep != "" || p.outboxKeep != "" || p.cdcSlots != "", "-keep, -inbox-keep, -outbox-keep and -cdc-slots belong to -janitor"),
		usageIf(p.consumer == "" && !p.all, "name the consumer with -consumer, or give -all to purge every consumer's claims"),
		usageIf(p.consumer != "" && p.all, "give -consumer or -all, not both"),
		usageIf((p.before == "") == (p.olderThan == ""), "give exactly one of -before DATE and -older-than AGE"),
		checkInput(operate.CheckConsumer("-consumer", p.consumer)))
	if err != nil {
		return err
	}
	if p.olderThan != "" {
		return ageFlag("-older-than", p.olderThan, &p.age)
	}
	if p.cutoff, err = parseCutoff(p.before); err != nil {
		return usagef("-before: %v", err)
	}
	return nil
}

// checkJanitor reads the janitor's windows: -inbox-keep defaults to -keep.
func (p *purge) checkJanitor() error {
	p.cfg.CDCSlots = splitList(p.cdcSlots)
	p.cfg.BatchSize = p.batch
	return operate.FirstError(
		usageIf(p.keep == "", "-janitor needs -keep: the retention window your services use (e.g. 168h)"),
		ageFlag("-keep", p.keep, &p.cfg.Default.Keep),
		ageFlag("-inbox-keep", cmp.Or(p.inboxKeep, p.keep), &p.cfg.InboxKeep),
		ageFlag("-outbox-keep", p.outboxKeep, &p.cfg.OutboxKeep))
}

func (p *purge) run(ctx context.Context, e *env) error {
	if p.janitor {
		p.cfg.Schema = e.g.schema
		return e.janitorRound(ctx, p.cfg)
	}
	cutoff, err := pastCutoff(ctx, e.db, p.age, p.cutoff)
	if err != nil {
		return err
	}
	n, err := retention.Purge(ctx, e.db, e.g.schema, retention.PurgeRequest{Consumer: p.consumer, Before: cutoff, DryRun: p.dryRun, BatchSize: p.batch})
	if err != nil {
		return fmt.Errorf("%w (deleted %d claim(s) before the error)", err, n)
	}
	out := map[string]any{"consumer": p.consumer, "all": p.all, "before": cutoff.UTC(), "dry_run": p.dryRun, "claims": n}
	return show(e, out, func(map[string]any) { e.printPurge(p, cutoff, n) })
}

// pastCutoff is the cutoff (now - age, by the database clock, when age is set), refused when
// it lies in the future.
func pastCutoff(ctx context.Context, db *sql.DB, age time.Duration, cutoff time.Time) (time.Time, error) {
	var now time.Time
	if err := db.QueryRowContext(ctx, `SELECT now()`).Scan(&now); err != nil {
		return cutoff, fmt.Errorf("read the database clock: %w", err)
	}
	if age > 0 {
		cutoff = now.Add(-age)
	}
	if cutoff.After(now) {
		return cutoff, fmt.Errorf("the cutoff %s is in the future (database time %s): purging claims that new would forget messages a broker is still delivering; give a past date", cutoff.UTC().Format(time.RFC3339), now.UTC().Format(time.RFC3339))
	}
	return cutoff, nil
}

func (e *env) printPurge(p *purge, cutoff time.Time, n int64) {
	who := fmt.Sprintf("consumer %q", p.consumer)
	if p.all {
		who = "every consumer"
	}
	if p.dryRun {
		fmt.Fprintf(e.stdout, "dry run: would delete %d claim(s) of %s applied before %s; run again without -dry-run to delete them\n", n, who, cutoff.UTC().Format(time.RFC3339))
		return
	}
	fmt.Fprintf(e.stdout, "deleted %d claim(s) of %s applied before %s\n", n, who, cutoff.UTC().Format(time.RFC3339))
	if n > 0 {
		fmt.Fprintf(e.stdout, "copies of those messages arriving from now on are no longer recognised as duplicates (unless the age guard refuses them)\n")
	}
}

// janitorRound runs one round of a janitor with cfg's windows and reports it.
func (e *env) janitorRound(ctx context.Context, cfg retention.Config) error {
	j, err := retention.NewJanitor(e.db, cfg, watermill.NopLogger{})
	if err != nil {
		return usagef("%v", err)
	}
	for _, w := range j.Warnings() {
		fmt.Fprintf(e.stderr, "warning: %s\n", w)
	}
	rep, err := j.RunOnce(ctx)
	if perr := show(e, janitorJSON(rep), func(map[string]any) { e.printJanitorRound(j.Config(), rep) }); perr != nil {
		return perr
	}
	return err
}

func (e *env) printJanitorRound(c retention.Config, rep retention.Report) {
	fmt.Fprintf(e.stdout, "janitor round on schema %s (claims older than %s, finished inbox rows older than %s, relayed outbox rows older than %s) took %s:\n",
		c.Schema, c.Default.Keep, c.InboxKeep, c.OutboxKeep, rep.Duration.Round(time.Millisecond))
	fmt.Fprintf(e.stdout, "  claims deleted:            %d%s\n", rep.Claims, byConsumer(rep.ClaimsByConsumer))
	fmt.Fprintf(e.stdout, "  day partitions dropped:    %d (created ahead: %d)\n", rep.DailyPartitionsDropped, rep.DailyPartitionsCreated)
	fmt.Fprintf(e.stdout, "  finished inbox rows:       %d%s\n", rep.InboxRows, byConsumer(rep.InboxRowsByConsumer))
	fmt.Fprintf(e.stdout, "  relayed outbox rows:       %d\n", rep.OutboxRows)
}

func janitorJSON(r retention.Report) map[string]any {
	return map[string]any{
		"claims": r.Claims, "claims_by_consumer": r.ClaimsByConsumer,
		"daily_partitions_dropped": r.DailyPartitionsDropped, "daily_partitions_created": r.DailyPartitionsCreated,
		"inbox_rows": r.InboxRows, "inbox_rows_by_consumer": r.InboxRowsByConsumer,
		"outbox_rows": r.OutboxRows, "http_keys": r.HTTPKeys, "duration_seconds": r.Duration.Seconds(),
	}
}

func byConsumer(m map[string]int64) string {
	if len(m) == 0 {
		return ""
	}
	names := make([]string, 0, len(m))
	for k := range m {
		names = append(names, k)
	}
	sort.Strings(names)
	parts := make([]string, len(names))
	for i, k := range names {
		parts[i] = fmt.Sprintf("%s %d", k, m[k])
	}
	return " (" + strings.Join(parts, ", ") + ")"
}

// parseAge reads a positive Go duration, or whole days as "30d".
func parseAge(s string) (time.Duration, error) {
	s = strings.TrimSpace(s)
	if days, ok := strings.CutSuffix(s, "d"); ok {
		n, err := strconv.Atoi(days)
		if err != nil || n < 1 {
			return 0, fmt.Errorf("%q is not a number of days (e.g. 30d)", s)
		}
		return time.Duration(n) * 24 * time.Hour, nil
	}
	d, err := time.ParseDuration(s)
	if err != nil {
		return 0, fmt.Errorf("%q is not an age: use e.g. 720h, 90m or 30d", s)
	}
	if d <= 0 {
		return 0, fmt.Errorf("the age must be positive, got %s", s)
	}
	return d, nil
}

// ageFlag reads the value of an age flag into d; "" leaves d alone (unset).
func ageFlag(flag, s string, d *time.Duration) error {
	if s == "" {
		return nil
	}
	v, err := parseAge(s)
	if err != nil {
		return usagef("%s: %v", flag, err)
	}
	*d = v
	return nil
}

// parseCutoff reads a date (midnight UTC) or an RFC 3339 time.
func parseCutoff(s string) (time.Time, error) {
	if t, err := time.Parse(time.DateOnly, s); err == nil {
		return t, nil
	}
	if t, err := time.Parse(time.RFC3339Nano, s); err == nil {
		return t, nil
	}
	return time.Time{}, fmt.Errorf("%q is neither a date (2026-11-01) nor an RFC 3339 time (2026-11-01T12:00:00Z)", s)
}
