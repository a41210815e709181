// Package migrate creates and upgrades watermill-once's tables: versioned SQL migrations
// embedded in the binary, applied under a PostgreSQL advisory lock, recorded in a version
// table, in a schema of your choice:
//
//	m, err := migrate.New(db, migrate.Config{Schema: "wmonce"}, logger)
//	res, err := m.Migrate(ctx, migrate.DirectionUp, nil)
//
// Teams with their own migration tool apply Print's SQL (`wmonce migrate print`), which writes
// the version rows as Migrate does (docs/schema.md).
//
// # Guarantees
//
// A Migrate call holds a session-level advisory lock, derived from the schema name, for its whole
// run: it reads the version and plans its path only once it holds the lock, and runs each
// migration in its own transaction together with its version row. Any number of instances may
// call Migrate at the same time, in either direction: the calls run one after the other, whole,
// each from the version the previous one left. A failed migration rolls back completely and
// leaves the version at the last migration that committed (Result.To). If the lock's
// connection breaks, the server releases the lock and the call fails at its next statement. A schema whose
// applied migrations differ from the binary's (the checksum of an up file, or a name) is left
// alone: Migrate fails with ErrChangedMigration before it runs anything; so is a version table
// with a row deleted below its highest version (ErrMissingVersion).
//
// Where it stops: the checksum covers the SQL as embedded, not the tables; a table changed by
// hand after its migration is not noticed.
package migrate
