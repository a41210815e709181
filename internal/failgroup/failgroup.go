// Package failgroup builds the statement that groups failed rows by fingerprint, for the three
// kinds of failure the operations tools show: FAILED inbox rows, parked messages and rejected
// outbox rows. Each kind says which rows are failed and which columns name them; the grouping
// (exact error texts first, so that the pattern of each distinct text is computed once; then
// by pattern), the example and the count of rows left out are written here once.
package failgroup

import (
	"context"
	"fmt"
	"regexp"
	"strconv"

	"github.com/wmonce/watermill-once/pgtx"
)

// Rows describes the failed rows of one kind. Its strings are SQL written by this module,
// never user text.
type Rows struct {
	// Kind is the first argument of failure_group_fingerprint: "inbox", "parked" or "rejected".
	Kind string
	// Select is a SELECT of every failed row of the kind, with no ORDER BY, whose columns are
	// who (the consumer, handler or relay), topic, reason (the error), at (when it failed, or
	// the nearest time the table keeps) and newest (larger for a newer row).
	Select string
	// NewestFirst orders Select's rows newest first, in its columns (e.g. `newest DESC`), for
	// a limit.
	NewestFirst string
}

// Query returns the statement that groups the newest maxRows failed rows (0: all of them) by
// fingerprint, the largest group first. Its columns: the fingerprint, who, topic, pattern, the
// reason of the group's newest row, the group's rows, the first and last at, and how many
// failed rows the limit left out (the same on every row). The failed rows are inlined where
// they are read (NOT MATERIALIZED), so the limit walks an index of the newest rows, as a
// query of the table itself would.
func Query(schema string, r Rows, maxRows int) (string, error) {
	if maxRows < 0 {
		return "", fmt.Errorf("maxRows must not be negative, got %d", maxRows)
	}
	limit := ""
	if maxRows > 0 {
		limit = " ORDER BY " + r.NewestFirst + " LIMIT " + strconv.Itoa(maxRows)
	}
	return `WITH failed AS NOT MATERIALIZED (` + r.Select + `
), recent AS (
    SELECT * FROM failed` + limit + `
), exact AS (
    SELECT who, topic, reason, count(*) AS n, min(at) AS first, max(at) AS last, max(newest) AS newest
    FROM recent GROUP BY 1, 2, 3
), patterned AS (
    SELECT *, ` + pgtx.QualifiedName(schema, "failure_pattern") + `(reason) AS pattern FROM exact
)
SELECT ` + pgtx.QualifiedName(schema, "failure_group_fingerprint") + `('` + r.Kind + `', who, topic, pattern), who, topic, pattern,
    (array_agg(reason ORDER BY newest DESC))[1], sum(n)::bigint, min(first), max(last),
    (SELECT count(*) FROM failed) - (SELECT count(*) FROM recent)
FROM patterned GROUP BY who, topic, pattern
ORDER BY sum(n) DESC, 1`, nil
}

// Read runs Query on q and returns its groups and how many failed rows the limit left out.
// columns returns pointers to the fields of a group that take Query's first eight columns, in
// their order (fingerprint, who, topic, pattern, example, rows, first and last at).
func Read[G any](ctx context.Context, q pgtx.Executor, schema string, r Rows, maxRows int, columns func(*G) []any) (groups []G, left int64, err error) {
	query, err := Query(schema, r, maxRows)
	if err != nil {
		return nil, 0, err
	}
	groups, err = pgtx.QueryAll(ctx, q, func(s pgtx.Scanner) (G, error) {
		var g G
		err := s.Scan(append(columns(&g), &left)...)
		return g, err
	}, query)
	if err != nil {
		return nil, 0, err
	}
	return groups, left, nil
}

var fingerprintPattern = regexp.MustCompile(`^[0-9a-f]{16}$`)

// CheckFingerprint refuses text that is not a failure group's fingerprint (of a rejected group
// or of an inbox failure group: they share the schema's rule).
func CheckFingerprint(fp string) error {
	if !fingerprintPattern.MatchString(fp) {
		return fmt.Errorf("fingerprint must be 16 lower-case hex digits (as failure groups list it), got %q", fp)
	}
	return nil
}
