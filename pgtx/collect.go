package pgtx

import (
	"context"
)

// Scanner is what a row offers to a scan function: *sql.Rows and *sql.Row both have it, so one
// scan function serves a list (QueryAll) and a single row (QueryRowContext).
type Scanner interface {
	Scan(dest ...any) error
}

// QueryAll runs query on q and returns one value per row, made by scan, in the order of the
// rows. It closes the rows and returns the error that ended them early (rows.Err: a lost
// connection, or a statement that failed after its first rows), which a loop written by hand
// easily forgets, and would then return part of the result as if it were whole. No rows give
// an empty slice, not nil, so the result encodes as [] in JSON.
func QueryAll[T any](ctx context.Context, q Executor, scan func(Scanner) (T, error), query string, args ...any) ([]T, error) {
	rows, err := q.QueryContext(ctx, query, args...)
	if err != nil {
		return nil, err
	}
	defer rows.Close()
	out := []T{}
	for rows.Next() {
		v, err := scan(rows)
		if err != nil {
			return nil, err
		}
		out = append(out, v)
	}
	if err := rows.Err(); err != nil {
		return nil, err
	}
	return out, nil
}
