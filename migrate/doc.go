// Package migrate creates and upgrades watermill-once's tables: versioned SQL migrations
// embedded in the binary, applied under a PostgreSQL advisory lock, recorded in a version
// table, in a schema of your choice.
//
// # Use
//
//	m, err := migrate.New(db, migrate.Config{Schema: "wmonce"}, logger)
//	res, err := m.Migrate(ctx, migrate.DirectionUp, nil)
//
// Teams that run their own migration tool can print the SQL instead (Print, or
// `wmonce migrate print`) and apply it there; the printed SQL has the schema name already
// quoted in and writes the version table as Migrate does (a row with its checksum per
// migration), so Migrate and the CLI see what it applied. A schema built from an earlier
// release's printed SQL, which wrote no version rows, is recorded with Baseline.
//
// # Guarantees
//
// A Migrate call holds a session-level advisory lock, derived from the schema name, for its whole
// run: it reads the version and plans its path only once it holds the lock, and runs each
// migration in its own transaction together with its version row. Any number of instances may
// call Migrate at the same time, in either direction: the calls run one after the other, whole,
// each from the version the previous one left (see Migrator.Migrate). A failed migration rolls
// back completely and leaves the version at the last migration that committed. A schema whose
// applied migrations differ from the binary's (the checksum of an up file, or a name) is left
// alone: Migrate fails with ErrChangedMigration before it runs anything; so is a version table
// with a row deleted below its highest version (ErrMissingVersion).
//
// Where it stops: the checksum covers the SQL as embedded, not the tables; a table changed by
// hand after its migration is not noticed.
package migrate
