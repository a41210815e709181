package migrate

import (
	"cmp"
	"fmt"
	"slices"
	"strings"

	"github.com/wmonce/watermill-once/pgtx"
)

// Print returns the SQL of the migrations after fromVersion up to toVersion (0: latest), or for
// DirectionDown from fromVersion down to above toVersion, for teams that apply SQL with their
// own tools. It writes the version rows as Migrate does; run it in one transaction
// (psql -1 -v ON_ERROR_STOP=1).
func Print(schema string, direction Direction, fromVersion, toVersion int) (string, error) {
	if err := pgtx.ValidateIdentifier("schema", schema); err != nil {
		return "", fmt.Errorf("migrate: %w", err)
	}
	all, err := All()
	if err != nil {
		return "", err
	}
	switch direction {
	case DirectionUp:
		return printUp(all, schema, fromVersion, cmp.Or(toVersion, len(all))), nil
	case DirectionDown:
		return printDown(all, schema, fromVersion, toVersion), nil
	}
	return "", fmt.Errorf("migrate: direction must be %q or %q, got %q", DirectionUp, DirectionDown, direction)
}

// printUp is the SQL of the migrations after from up to to, each with the INSERT of its
// version row, after the schema and the version table.
func printUp(all []Migration, schema string, from, to int) string {
	versions := pgtx.QualifiedName(schema, "schema_migrations")
	var b strings.Builder
	fmt.Fprintf(&b, "CREATE SCHEMA IF NOT EXISTS %s;\n", pgtx.QuoteIdentifier(schema))
	// The version table as Migrate creates it; one an earlier release's Migrate created may
	// lack the checksum column (added here without the notice ADD COLUMN IF NOT EXISTS prints).
	fmt.Fprintf(&b, "%s;\n", versionTableDDL(schema))
	fmt.Fprintf(&b, "DO $$ BEGIN\n    IF NOT EXISTS (SELECT FROM pg_attribute WHERE attrelid = '%s'::regclass AND attname = 'checksum' AND NOT attisdropped) THEN\n"+
		"        ALTER TABLE %s ADD COLUMN checksum text;\n    END IF;\nEND $$;\n", versions, versions)
	for _, m := range all {
		if between(m.Version, from, to) {
			fmt.Fprintf(&b, "\n-- %03d_%s (up)\n%s", m.Version, m.Name, render(m.up, schema))
			fmt.Fprintf(&b, "INSERT INTO %s (version, name, checksum) VALUES (%d, '%s', '%s');\n", versions, m.Version, m.Name, m.Checksum())
		}
	}
	return b.String()
}

// printDown is the SQL of the migrations from from down to above to, newest first, each with
// the DELETE of its version row.
func printDown(all []Migration, schema string, from, to int) string {
	versions := pgtx.QualifiedName(schema, "schema_migrations")
	var b strings.Builder
	for _, m := range slices.Backward(all) {
		if between(m.Version, to, from) {
			fmt.Fprintf(&b, "\n-- %03d_%s (down)\n%s", m.Version, m.Name, render(m.down, schema))
			fmt.Fprintf(&b, "DELETE FROM %s WHERE version = %d;\n", versions, m.Version)
		}
	}
	return b.String()
}
