package pgtx

import (
	"database/sql"
	"fmt"
)

// CheckTxOptions refuses, naming field, options (nil: the default) that cannot begin the
// read-write transactions of this module: ReadOnly, or an isolation level PostgreSQL does not
// have (sql.LevelSnapshot pgx would silently run as REPEATABLE READ).
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
