// Package sqlrebase finds and repairs the SQL broker's topic tables after a backup restored
// into another cluster (`wmonce rebase`, `wmonce doctor`, the subscriptions' restore check).
//
// watermill-sql (v3 and v4 alike) orders a topic by the inserting transaction's id
// (transaction_id xid8, then "offset") and keeps each consumer group's position as the last
// (last_processed_transaction_id, offset_acked) it acked. Those ids are the source cluster's: a
// logical dump restored into a cluster whose transaction counter is lower leaves rows and
// positions "in the future". A subscription then sees nothing published after the restore (its
// ids are below the group's position) and nothing unconsumed from before it (its ids are not
// below the server's xmin yet) until the counter passes the source's; what was published in
// between is skipped for good. A restore into a cluster with a higher counter keeps the order
// and needs nothing.
//
// Check detects the first case (an id at or above the server's next transaction id
// cannot have been written here); each SQL subscription runs its probes on its own table and
// logs broker.ErrSQLTopicsMoved at ERROR. Rebase
// repairs it (wmonce rebase runs it). Once the counter has passed every copied id the move can
// no longer be seen in these tables, and what was skipped meanwhile stays skipped: rebase as
// soon as the restore is done, before starting publishers.
package sqlrebase

import (
	"cmp"
	"context"
	"database/sql"
	"errors"
	"fmt"
	"slices"
	"strconv"
	"strings"

	"github.com/wmonce/watermill-once/pgtx"
)

// ErrMoved reports topic tables that hold transaction ids of another cluster.
var ErrMoved = errors.New("broker: SQL topic tables hold transaction ids ahead of this cluster's (restored from a backup of another cluster?): subscriptions miss messages until `wmonce rebase` is run")

// frozenXid is the transaction id Rebase gives copied rows every group had consumed:
// PostgreSQL's FrozenTransactionId, below every position it sets.
const frozenXid = 2

// Position is a consumer group's stored position in a topic table: the transaction id and
// offset of the last row it acked.
type Position struct {
	Xid    uint64
	Offset int64
}

func (p Position) String() string { return fmt.Sprintf("(%d, %d)", p.Xid, p.Offset) }

// less orders positions as watermill-sql reads rows: by transaction id, then offset.
func (p Position) less(q Position) bool {
	return p.Xid < q.Xid || (p.Xid == q.Xid && p.Offset < q.Offset)
}

// TopicMove describes one topic table's ids ahead of the cluster.
type TopicMove struct {
	Topic string
	// FutureRows counts rows whose transaction id is at or above the cluster's next one: none
	// of them is delivered until the counter passes it.
	FutureRows int64
	// GroupsAhead are the consumer groups whose position is ahead of the cluster: they skip
	// every row published from now on until the counter passes their position.
	GroupsAhead []string
}

// moved says whether the table holds rows or group positions ahead of the cluster.
func (m TopicMove) moved() bool { return m.FutureRows > 0 || len(m.GroupsAhead) > 0 }

// MoveReport is what Check found in a schema.
type MoveReport struct {
	Schema string
	// NextXid is the cluster's next transaction id when the check ran.
	NextXid uint64
	// Topics counts the topic tables checked.
	Topics int
	// Moved lists the topic tables with ids ahead of NextXid; empty when none.
	Moved []TopicMove
}

// Err returns nil when no topic table moved, else ErrMoved wrapped with the tables.
func (r MoveReport) Err() error {
	if len(r.Moved) == 0 {
		return nil
	}
	parts := make([]string, 0, len(r.Moved))
	for _, m := range r.Moved {
		parts = append(parts, fmt.Sprintf("%s (%d rows ahead, groups ahead: %s)", m.Topic, m.FutureRows, strings.Join(m.GroupsAhead, ", ")))
	}
	return fmt.Errorf("%w; schema %q, next transaction id %d: %s", ErrMoved, r.Schema, r.NextXid, strings.Join(parts, "; "))
}

// topicTables is a topic table found in a schema, with its offsets table when there is one.
type topicTables struct {
	topic            string
	messages, offset string // quoted, schema-qualified
	hasOffsets       bool
}

// listSQLTopics returns the watermill-sql topic tables of schema: tables named watermill_<topic>
// with watermill-sql's transaction_id and "offset" columns (so that a topic named offsets_x is
// not taken for the offsets table of x).
func listSQLTopics(ctx context.Context, q pgtx.Executor, schema string) ([]topicTables, error) {
	tables, err := pgtx.QueryAll(ctx, q, func(s pgtx.Scanner) (watermillTable, error) {
		var t watermillTable
		err := s.Scan(&t.name, &t.offsets)
		return t, err
	}, `SELECT c.relname,
	EXISTS (SELECT 1 FROM pg_attribute a WHERE a.attrelid = c.oid AND a.attname = 'last_processed_transaction_id' AND NOT a.attisdropped)
FROM pg_class c JOIN pg_namespace n ON n.oid = c.relnamespace
WHERE n.nspname = $1 AND c.relkind IN ('r', 'p') AND c.relname LIKE 'watermill\_%'
	AND (EXISTS (SELECT 1 FROM pg_attribute a WHERE a.attrelid = c.oid AND a.attname = 'transaction_id' AND a.atttypid = 'xid8'::regtype AND NOT a.attisdropped)
	 AND EXISTS (SELECT 1 FROM pg_attribute a WHERE a.attrelid = c.oid AND a.attname = 'offset' AND NOT a.attisdropped)
	 OR EXISTS (SELECT 1 FROM pg_attribute a WHERE a.attrelid = c.oid AND a.attname = 'last_processed_transaction_id' AND NOT a.attisdropped))
ORDER BY c.relname`, schema)
	if err != nil {
		return nil, err
	}
	return pairTables(schema, tables), nil
}

// watermillTable is a table of watermill-sql's: a topic's messages, or its offsets.
type watermillTable struct {
	name    string
	offsets bool
}

// pairTables gives each topic table of schema its offsets table, when there is one.
func pairTables(schema string, tables []watermillTable) []topicTables {
	offsets := map[string]bool{}
	for _, t := range tables {
		if t.offsets {
			offsets[t.name] = true
		}
	}
	var topics []topicTables
	for _, t := range tables {
		if t.offsets {
			continue
		}
		topic := strings.TrimPrefix(t.name, "watermill_")
		topics = append(topics, topicTables{
			topic:      topic,
			messages:   pgtx.QualifiedName(schema, t.name),
			offset:     pgtx.QualifiedName(schema, "watermill_offsets_"+topic),
			hasOffsets: offsets["watermill_offsets_"+topic],
		})
	}
	return topics
}

// nextXid returns the server's next transaction id (the current snapshot's xmax): no row or
// position written on this cluster can have an id at or above it.
func nextXid(ctx context.Context, q pgtx.Executor) (uint64, error) {
	var text string
	if err := q.QueryRowContext(ctx, `SELECT pg_snapshot_xmax(pg_current_snapshot())::text`).Scan(&text); err != nil {
		return 0, err
	}
	return strconv.ParseUint(text, 10, 64)
}

// futureRowsQuery counts t's rows at or above $1, or only says whether there is one (0 or 1)
// when countRows is false: one index probe.
func futureRowsQuery(t topicTables, countRows bool) string {
	if countRows {
		return `SELECT count(*) FROM ` + t.messages + ` WHERE transaction_id >= $1::xid8`
	}
	return `SELECT count(*) FROM (SELECT 1 FROM ` + t.messages + ` WHERE transaction_id >= $1::xid8 LIMIT 1) AS x`
}

// checkSQLTopic reports t's rows and group positions at or above next. A row is looked for
// through the primary key's leading column, so the check is one index probe per table.
func checkSQLTopic(ctx context.Context, q pgtx.Executor, t topicTables, next uint64, countRows bool) (TopicMove, error) {
	m := TopicMove{Topic: t.topic}
	if err := q.QueryRowContext(ctx, futureRowsQuery(t, countRows), strconv.FormatUint(next, 10)).Scan(&m.FutureRows); err != nil {
		return m, fmt.Errorf("broker: check topic table %s: %w", t.messages, err)
	}
	if !t.hasOffsets {
		return m, nil
	}
	groups, err := pgtx.QueryAll(ctx, q, func(s pgtx.Scanner) (string, error) {
		var g string
		err := s.Scan(&g)
		return g, err
	}, `SELECT consumer_group FROM `+t.offset+` WHERE last_processed_transaction_id >= $1::xid8 ORDER BY consumer_group`, strconv.FormatUint(next, 10))
	if err != nil {
		return m, fmt.Errorf("broker: check offsets table %s: %w", t.offset, err)
	}
	m.GroupsAhead = groups
	return m, nil
}

// Check reports the SQL broker's topic tables in schema whose rows or consumer-group
// positions carry transaction ids at or above the cluster's next one: ids of another cluster,
// left by a restore into a cluster with a lower transaction counter. Subscriptions on such a
// table miss messages (see Rebase, which repairs it). The report's Err is nil when
// nothing moved. It reads only; each table costs an index probe and a scan of its offsets.
func Check(ctx context.Context, db pgtx.Executor, schema string) (MoveReport, error) {
	r := MoveReport{Schema: schema}
	if err := pgtx.ValidateIdentifier("schema", schema); err != nil {
		return r, fmt.Errorf("broker: Check: %w", err)
	}
	topics, err := listSQLTopics(ctx, db, schema)
	if err != nil {
		return r, fmt.Errorf("broker: list topic tables of schema %q: %w", schema, err)
	}
	if r.NextXid, err = nextXid(ctx, db); err != nil {
		return r, fmt.Errorf("broker: read the next transaction id: %w", err)
	}
	r.Topics = len(topics)
	r.Moved, err = movedTopics(ctx, db, topics, r.NextXid)
	return r, err
}

// movedTopics checks each topic table against next and returns those that moved.
func movedTopics(ctx context.Context, db pgtx.Executor, topics []topicTables, next uint64) ([]TopicMove, error) {
	var moved []TopicMove
	for _, t := range topics {
		m, err := checkSQLTopic(ctx, db, t, next, true)
		if err != nil {
			return moved, err
		}
		if m.moved() {
			moved = append(moved, m)
		}
	}
	return moved, nil
}

// GroupRebase is what Rebase did to one consumer group's position.
type GroupRebase struct {
	Group    string
	From, To Position
	// Rereads counts the rows the group reads again: every row it had not provably consumed.
	Rereads int64
}

// TopicRebase is what Rebase did to one topic table.
type TopicRebase struct {
	Topic string
	// Republished counts rows given a current transaction id: rows some group had not
	// provably consumed.
	Republished int64
	// Frozen counts copied rows every group had consumed, given the frozen id 2 (below every
	// position, so no group reads them again; a new group does).
	Frozen int64
	Groups []GroupRebase
}

// Report is what Rebase did to a schema. Topics lists only the tables that
// had moved; a schema with none is left untouched.
type Report struct {
	Schema  string
	NextXid uint64
	Topics  []TopicRebase
}

// Rebase repairs the SQL broker's topic tables in schema after a restore into a
// cluster with a lower transaction counter (Check finds them; tables that did not
// move are left alone, so running it again, or on a healthy schema, changes nothing). Each
// moved table is rebased in one transaction that locks out its publishers and subscriptions,
// so that each group reads again exactly the rows it had not provably consumed, in their
// order, before anything published later; the claims of the effectively-once middleware and
// of the inbox absorb what a group still receives twice. Every group of the table's offsets
// table is covered, watermill-sql subscribers of your own included when they use the broker's
// offsets tables (docs/brokers.md, "SQL: after a backup and restore").
func Rebase(ctx context.Context, db pgtx.Beginner, schema string) (Report, error) {
	// How each moved table is rebased:
	//
	//   - a row is provably consumed by a group when the group's position and the row are both
	//     the source cluster's (the position at or above this cluster's next transaction id; the row
	//     likewise, or with an offset at most that of such a row, since the offset sequence was
	//     restored with the table) and the row is at or before the position. Anything else, rows
	//     published after the restore included, is unconsumed: the safe direction;
	//   - rows every group had consumed keep their place below every position (copied ids become
	//     the frozen id 2);
	//   - every other row gets a transaction id below the server's current xmin (so it is visible at
	//     once and before anything published later), ordered so that each group's new position sits
	//     just after the rows it had consumed: each group reads again exactly the rows it had not
	//     provably consumed, in their order; a row one group consumed and another did not is read
	//     again only by the other.
	r := Report{Schema: schema}
	if err := pgtx.ValidateIdentifier("schema", schema); err != nil {
		return r, fmt.Errorf("broker: Rebase: %w", err)
	}
	var topics []topicTables
	err := pgtx.RunInTx(ctx, db, nil, pgtx.RetryPolicy{}, func(ctx context.Context, tx *sql.Tx) error {
		var err error
		topics, err = listSQLTopics(ctx, tx, schema)
		return err
	})
	if err != nil {
		return r, fmt.Errorf("broker: list topic tables of schema %q: %w", schema, err)
	}
	for _, t := range topics {
		var done *TopicRebase
		done, r.NextXid, err = rebaseInTx(ctx, db, t)
		if err != nil {
			return r, fmt.Errorf("broker: rebase topic table %s: %w", t.messages, err)
		}
		if done != nil {
			r.Topics = append(r.Topics, *done)
		}
	}
	return r, nil
}

type sqlGroupPos struct {
	group  string
	pos    Position
	source bool // written on the source cluster (at or above the next transaction id)
	// consumedBy is, for a source group, how many source groups are at or past its position:
	// it consumed exactly the rows that many or more groups consumed.
	consumedBy int
}

// rebaseInTx rebases one table in a transaction of its own (rebaseSQLTopic).
func rebaseInTx(ctx context.Context, db pgtx.Beginner, t topicTables) (done *TopicRebase, next uint64, err error) {
	err = pgtx.RunInTx(ctx, db, nil, pgtx.RetryPolicy{}, func(ctx context.Context, tx *sql.Tx) error {
		var err error
		done, next, err = rebaseSQLTopic(ctx, tx, t)
		return err
	})
	return done, next, err
}

// rebaseSQLTopic rebases one table in tx; nil when the table had not moved.
func rebaseSQLTopic(ctx context.Context, tx *sql.Tx, t topicTables) (*TopicRebase, uint64, error) {
	if err := lockSQLTopic(ctx, tx, t); err != nil {
		return nil, 0, err
	}
	xmin, next, err := sqlSnapshotBounds(ctx, tx)
	if err != nil {
		return nil, 0, err
	}
	move, err := checkSQLTopic(ctx, tx, t, next, false)
	if err != nil {
		return nil, next, err
	}
	if !move.moved() {
		return nil, next, nil
	}
	groups, err := sqlTopicGroups(ctx, tx, t)
	if err != nil {
		return nil, next, err
	}
	sources, srcXids, srcOffsets := markSourceGroups(groups, next)
	all := len(groups)
	// The ids given below: tier(c) for rows c source groups consumed, in [xmin-1-sources,
	// xmin-1]; a group that consumed nothing provably is placed below them all.
	if xmin < uint64(sources)+8 {
		return nil, next, fmt.Errorf("broker: the cluster's transaction counter (%d) is too low to rebase %d groups", xmin, sources)
	}
	tier := func(c int) uint64 { return xmin - 1 - uint64(c) }

	maxOffset, lastCopied, err := tableOffsets(ctx, tx, t, next)
	if err != nil {
		return nil, next, err
	}

	// consumed: how many source groups provably consumed each row.
	consumed := `WITH g AS (SELECT x::xid8 AS x, o FROM unnest($1::text[], $2::bigint[]) AS u(x, o)),
c AS (
	SELECT m.transaction_id AS tid, m."offset" AS off,
		(SELECT count(*) FROM g WHERE (m.transaction_id >= $3::xid8 OR m."offset" <= $4)
			AND (m.transaction_id, m."offset") <= (g.x, g.o))::int AS c
	FROM ` + t.messages + ` AS m
)`
	args := []any{"{" + strings.Join(srcXids, ",") + "}", int64Array(srcOffsets), strconv.FormatUint(next, 10), lastCopied}
	hist, err := consumedHistogram(ctx, tx, consumed, args)
	if err != nil {
		return nil, next, fmt.Errorf("count consumed rows: %w", err)
	}

	// Rows every group consumed keep a low id: copied ones (and any that would sort among the
	// new ids) become frozenXid, the others stay. Every other row gets tier(c).
	changed, err := execCount(ctx, tx, consumed+`
UPDATE `+t.messages+` AS m SET transaction_id = (CASE WHEN c.c = $5 THEN $6::bigint ELSE $7::bigint - c.c END)::text::xid8
FROM c WHERE m.transaction_id = c.tid AND m."offset" = c.off
	AND NOT (c.c = $5 AND m.transaction_id < $8::xid8)`,
		append(args, all, int64(frozenXid), int64(xmin-1), strconv.FormatUint(tier(all), 10))...)
	if err != nil {
		return nil, next, fmt.Errorf("move rows: %w", err)
	}

	done := &TopicRebase{Topic: t.topic, Republished: republished(hist, all)}
	done.Frozen = changed - done.Republished
	// A group that consumed nothing provably goes below every tier, at the table's end offset.
	if done.Groups, err = moveSQLGroups(ctx, tx, t, groups, hist, tier, Position{Xid: tier(sources) - 1, Offset: maxOffset}); err != nil {
		return nil, next, err
	}
	return done, next, nil
}

// tableOffsets reads t's highest offset (0 when empty) and the highest offset of a row copied
// from the source cluster (an id at or above next; NULL when none).
func tableOffsets(ctx context.Context, tx *sql.Tx, t topicTables, next uint64) (maxOffset int64, lastCopied sql.NullInt64, err error) {
	err = tx.QueryRowContext(ctx, `SELECT coalesce(max("offset"), 0), max("offset") FILTER (WHERE transaction_id >= $1::xid8) FROM `+t.messages,
		strconv.FormatUint(next, 10)).Scan(&maxOffset, &lastCopied)
	return maxOffset, lastCopied, err
}

// execCount runs query in tx and returns how many rows it changed.
func execCount(ctx context.Context, tx *sql.Tx, query string, args ...any) (int64, error) {
	res, err := tx.ExecContext(ctx, query, args...)
	if err != nil {
		return 0, err
	}
	return res.RowsAffected()
}

// republished counts the rows of hist (rows by how many of all the source groups consumed
// them) that some group had not consumed: the rows given a current transaction id.
func republished(hist map[int]int64, all int) int64 {
	var n int64
	for c, rows := range hist {
		if c < all {
			n += rows
		}
	}
	return n
}

// moveSQLGroups moves each group: a source group to the tier of the rows it consumed, any
// other to below, and reports them by group name.
func moveSQLGroups(ctx context.Context, tx *sql.Tx, t topicTables, groups []sqlGroupPos, hist map[int]int64, tier func(int) uint64, below Position) ([]GroupRebase, error) {
	var moved []GroupRebase
	for _, g := range groups {
		to := below
		if g.source {
			to.Xid = tier(g.consumedBy)
		}
		if _, err := tx.ExecContext(ctx, `UPDATE `+t.offset+` SET last_processed_transaction_id = $1::xid8, offset_acked = $2 WHERE consumer_group = $3`,
			strconv.FormatUint(to.Xid, 10), to.Offset, g.group); err != nil {
			return nil, fmt.Errorf("move group %q: %w", g.group, err)
		}
		moved = append(moved, GroupRebase{Group: g.group, From: g.pos, To: to, Rereads: g.rereads(hist)})
	}
	slices.SortFunc(moved, func(a, b GroupRebase) int { return cmp.Compare(a.Group, b.Group) })
	return moved, nil
}

// lockSQLTopic locks the offsets first, as a subscription's batch takes them (its FOR
// UPDATE), then the rows (waits for publishing transactions to commit and keeps new ones out
// until COMMIT).
func lockSQLTopic(ctx context.Context, tx *sql.Tx, t topicTables) error {
	if t.hasOffsets {
		if _, err := tx.ExecContext(ctx, `LOCK TABLE `+t.offset+` IN EXCLUSIVE MODE`); err != nil {
			return err
		}
	}
	_, err := tx.ExecContext(ctx, `LOCK TABLE `+t.messages+` IN SHARE ROW EXCLUSIVE MODE`)
	return err
}

// sqlSnapshotBounds returns the xmin and xmax (the next transaction id) of tx's snapshot.
func sqlSnapshotBounds(ctx context.Context, tx *sql.Tx) (xmin, next uint64, err error) {
	var xminText, xmaxText string
	if err := tx.QueryRowContext(ctx, `SELECT pg_snapshot_xmin(s)::text, pg_snapshot_xmax(s)::text FROM pg_current_snapshot() AS s`).Scan(&xminText, &xmaxText); err != nil {
		return 0, 0, err
	}
	if xmin, err = strconv.ParseUint(xminText, 10, 64); err != nil {
		return 0, 0, err
	}
	if next, err = strconv.ParseUint(xmaxText, 10, 64); err != nil {
		return 0, 0, err
	}
	return xmin, next, nil
}

// sqlTopicGroups reads the consumer groups' positions; none when the table has no offsets.
func sqlTopicGroups(ctx context.Context, tx *sql.Tx, t topicTables) ([]sqlGroupPos, error) {
	if !t.hasOffsets {
		return nil, nil
	}
	return pgtx.QueryAll(ctx, tx, func(s pgtx.Scanner) (sqlGroupPos, error) {
		var g sqlGroupPos
		var x string
		if err := s.Scan(&g.group, &x, &g.pos.Offset); err != nil {
			return g, err
		}
		xid, err := strconv.ParseUint(x, 10, 64)
		g.pos.Xid = xid
		return g, err
	}, `SELECT consumer_group, last_processed_transaction_id::text, coalesce(offset_acked, 0) FROM `+t.offset+` ORDER BY consumer_group`)
}

// markSourceGroups marks the groups written on the source cluster (at or above next) and
// counts for each how many source groups are at or past it; it returns the number of source
// groups and their positions as the query arguments.
func markSourceGroups(groups []sqlGroupPos, next uint64) (sources int, srcXids []string, srcOffsets []int64) {
	for i := range groups {
		if groups[i].pos.Xid >= next {
			groups[i].source = true
			sources++
			srcXids = append(srcXids, strconv.FormatUint(groups[i].pos.Xid, 10))
			srcOffsets = append(srcOffsets, groups[i].pos.Offset)
		}
	}
	markConsumedBy(groups)
	return sources, srcXids, srcOffsets
}

// markConsumedBy sets each source group's consumedBy.
func markConsumedBy(groups []sqlGroupPos) {
	for i := range groups {
		if groups[i].source {
			groups[i].consumedBy = countConsumedBy(groups, groups[i].pos)
		}
	}
}

// countConsumedBy is how many source groups are at or past pos.
func countConsumedBy(groups []sqlGroupPos, pos Position) int {
	n := 0
	for _, h := range groups {
		if h.source && !h.pos.less(pos) {
			n++
		}
	}
	return n
}

// consumedHistogram runs the consumed query: rows by how many source groups consumed them.
func consumedHistogram(ctx context.Context, tx *sql.Tx, consumed string, args []any) (map[int]int64, error) {
	hist := map[int]int64{}
	err := pgtx.QueryEach(ctx, tx, func(s pgtx.Scanner) error {
		var c int
		var n int64
		if err := s.Scan(&c, &n); err != nil {
			return err
		}
		hist[c] = n
		return nil
	}, consumed+` SELECT c, count(*) FROM c GROUP BY c`, args...)
	return hist, err
}

// rereads is how many rows g reads again after the rebase: a group not on the source reads
// them all, a source group the rows fewer than its consumedBy groups consumed.
func (g sqlGroupPos) rereads(hist map[int]int64) int64 {
	var n int64
	for c, k := range hist {
		if !g.source || c < g.consumedBy {
			n += k
		}
	}
	return n
}

// int64Array formats a PostgreSQL bigint[] literal (database/sql has no array type).
func int64Array(v []int64) string {
	parts := make([]string, len(v))
	for i, n := range v {
		parts[i] = strconv.FormatInt(n, 10)
	}
	return "{" + strings.Join(parts, ",") + "}"
}

// String is the report in a line per topic table, as `wmonce rebase -dry-run` prints it.
func (r MoveReport) String() string {
	if len(r.Moved) == 0 {
		return fmt.Sprintf("schema %s: no topic table ahead of this cluster's transaction counter (%d checked, next id %d)", r.Schema, r.Topics, r.NextXid)
	}
	var b strings.Builder
	fmt.Fprintf(&b, "schema %s: %d topic table(s) hold ids ahead of this cluster's next one (%d): run `wmonce rebase -broker-schema %s`", r.Schema, len(r.Moved), r.NextXid, r.Schema)
	for _, m := range r.Moved {
		fmt.Fprintf(&b, "\n  topic %s: %d row(s) ahead; groups ahead: %s", m.Topic, m.FutureRows, strings.Join(m.GroupsAhead, ", "))
	}
	return b.String()
}

// String is the report in a line per topic table and group, as `wmonce rebase` prints it.
func (r Report) String() string {
	if len(r.Topics) == 0 {
		return fmt.Sprintf("schema %s: no topic table to rebase", r.Schema)
	}
	var b strings.Builder
	fmt.Fprintf(&b, "schema %s: %d topic table(s) rebased", r.Schema, len(r.Topics))
	for _, t := range r.Topics {
		t.write(&b)
	}
	return b.String()
}

// write adds the topic's lines of Report.String to b.
func (t TopicRebase) write(b *strings.Builder) {
	fmt.Fprintf(b, "\n  topic %s: %d row(s) to be read again, %d consumed row(s) frozen", t.Topic, t.Republished, t.Frozen)
	for _, g := range t.Groups {
		fmt.Fprintf(b, "\n    group %s: position %s -> %s, reads %d row(s) again", g.Group, g.From, g.To, g.Rereads)
	}
}
