package pgtx

import (
	"database/sql"
	"fmt"
)

// CheckTxOptions returns nil when o (nil: the component's default) can begin the read-write
// transactions a component of this module runs, else an error that names field and says what
// to use: every such transaction writes (a claim, a status, an outbox row), so ReadOnly fails
// every one with SQLSTATE 25006, and an isolation level PostgreSQL does not have fails every
// BEGIN ("unsupported isolation") or, for sql.LevelSnapshot, is silently run as REPEATABLE
// READ by pgx. The one check of every Config that takes a *sql.TxOptions, so that such a
// configuration is refused at construction, not at each message.
func CheckTxOptions(field string, o *sql.TxOptions) error {
	if o == nil {
		return nil
	}
	if o.ReadOnly {
		return fmt.Errorf("%s.ReadOnly must be false: the transaction writes (claims, statuses, outbox rows), so a read-only one fails every time with SQLSTATE 25006", field)
	}
	switch o.Isolation {
	case sql.LevelDefault, sql.LevelReadUncommitted, sql.LevelReadCommitted, sql.LevelRepeatableRead, sql.LevelSerializable:
		return nil
	case sql.LevelSnapshot:
		return fmt.Errorf("%s.Isolation must be a PostgreSQL level (LevelReadCommitted, LevelRepeatableRead or LevelSerializable), got %v: PostgreSQL has no SNAPSHOT level; use sql.LevelRepeatableRead, which is what pgx would run", field, o.Isolation)
	}
	return fmt.Errorf("%s.Isolation must be a PostgreSQL level (LevelReadCommitted, LevelRepeatableRead or LevelSerializable), got %v, which PostgreSQL does not have", field, o.Isolation)
}
