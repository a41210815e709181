package broker

import (
	"context"
	"sync"
	"time"

	"github.com/ThreeDotsLabs/watermill"
)

// How often an idle SQL subscription checks its topic table for ids of another cluster
// (CheckSQLTopics), and how often it repeats the ERROR while they are there.
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
	m.mu.Lock()
	now := time.Now()
	if !m.lastCheck.IsZero() && now.Sub(m.lastCheck) < moveCheckInterval {
		m.mu.Unlock()
		return
	}
	m.lastCheck = now
	m.mu.Unlock()

	ctx, cancel := context.WithTimeout(m.ctx, moveCheckTimeout)
	defer cancel()
	t := topicTables{topic: m.topic, messages: m.s.MessagesTable(m.topic), offset: m.s.OffsetsTable(m.topic), hasOffsets: true}
	next, err := nextXid(ctx, m.s.db)
	if err != nil {
		return // the query that follows reports a broken connection
	}
	move, err := checkSQLTopic(ctx, m.s.db, t, next, false)
	if err != nil || (move.FutureRows == 0 && len(move.GroupsAhead) == 0) {
		return
	}
	m.mu.Lock()
	logNow := m.lastLog.IsZero() || now.Sub(m.lastLog) >= moveLogInterval
	if logNow {
		m.lastLog = now
	}
	m.mu.Unlock()
	if logNow {
		logger.Error("SQL broker topic table holds transaction ids ahead of this cluster's (restored from a backup into a cluster with a lower counter?): "+
			"this subscription receives nothing published since, nor the older rows ahead, until the counter passes them; "+
			"stop publishing and run `wmonce rebase` (broker.RebaseSQLTopics)",
			ErrSQLTopicsMoved, watermill.LogFields{
				"topic": m.topic, "consumer_group": m.group, "schema": m.s.config.Schema,
				"next_xid": next, "rows_ahead": move.FutureRows > 0, "groups_ahead": move.GroupsAhead,
			})
	}
	m.signal(m.topic)
}
