package broker

import (
	"context"
	"sync"
	"time"

	"github.com/ThreeDotsLabs/watermill"

	"github.com/wmonce/watermill-once/internal/sqlrebase"
)

// How often an idle SQL subscription checks its topic table for ids of another cluster
// (sqlrebase.Check), and how often it repeats the ERROR while they are there.
const (
	moveCheckInterval = 30 * time.Second
	moveLogInterval   = 5 * time.Minute
	moveCheckTimeout  = 5 * time.Second
)

// moveWatch is a subscription's backoff with the restore check: after a query that found
// nothing (the only symptom of a moved table: it looks empty) at most every moveCheckInterval,
// it probes its topic table and logs at ERROR, at most every moveLogInterval, when rows or its
// group's position are ahead of the cluster. The first empty query checks at once.
type moveWatch struct {
	next   sqlBackoff
	s      *sqlBroker
	topic  string
	group  string
	ctx    context.Context
	signal func(topic string) // brokerTestSignals.SQLMoveDetected

	mu        sync.Mutex
	lastCheck time.Time
	lastLog   time.Time
}

func (m *moveWatch) HandleError(logger watermill.LoggerAdapter, noMsg bool, err error) time.Duration {
	if noMsg && err == nil {
		m.check(logger)
	}
	return m.next.HandleError(logger, noMsg, err)
}

func (m *moveWatch) check(logger watermill.LoggerAdapter) {
	now := time.Now()
	if !m.due(&m.lastCheck, now, moveCheckInterval) {
		return
	}
	ctx, cancel := context.WithTimeout(m.ctx, moveCheckTimeout)
	defer cancel()
	// One statement (sqlrebase.Check's probes of one table, with the next transaction id): an idle
	// subscription's queries are what its pool costs the server when nothing happens.
	var next, groupsAhead string
	var rowsAhead bool
	err := m.s.db.QueryRowContext(ctx, `SELECT x::text,
  EXISTS (SELECT 1 FROM `+m.s.MessagesTable(m.topic)+` WHERE transaction_id >= x),
  coalesce((SELECT string_agg(consumer_group, ', ' ORDER BY consumer_group) FROM `+m.s.OffsetsTable(m.topic)+`
            WHERE last_processed_transaction_id >= x), '')
FROM (SELECT pg_snapshot_xmax(pg_current_snapshot()) AS x) AS s`).Scan(&next, &rowsAhead, &groupsAhead)
	if err != nil || (!rowsAhead && groupsAhead == "") {
		return // an error: the query that follows reports a broken connection
	}
	if m.due(&m.lastLog, now, moveLogInterval) {
		logger.Error("SQL broker topic table holds transaction ids ahead of this cluster's (restored from a backup into a cluster with a lower counter?): "+
			"this subscription receives nothing published since, nor the older rows ahead, until the counter passes them; "+
			"stop publishing and run `wmonce rebase`",
			ErrSQLTopicsMoved, watermill.LogFields{
				"topic": m.topic, "consumer_group": m.group, "schema": m.s.config.Schema,
				"next_xid": next, "rows_ahead": rowsAhead, "groups_ahead": groupsAhead,
			})
	}
	m.signal(m.topic)
}

// due says whether interval has passed since *last (or nothing happened yet) and, if so,
// records now as the last time.
func (m *moveWatch) due(last *time.Time, now time.Time, interval time.Duration) bool {
	m.mu.Lock()
	defer m.mu.Unlock()
	if !last.IsZero() && now.Sub(*last) < interval {
		return false
	}
	*last = now
	return true
}

// ErrSQLTopicsMoved is what an SQL subscription logs at ERROR when its topic table holds
// transaction ids of another cluster (a restore into a cluster with a lower counter): run
// `wmonce rebase` (docs/brokers.md, "SQL: after a backup and restore").
var ErrSQLTopicsMoved = sqlrebase.ErrMoved
