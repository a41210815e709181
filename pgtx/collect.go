package pgtx

import (
	"context"
)

// Scanner is what a row offers to a scan function: *sql.Rows and *sql.Row both have it, so one
// scan function serves a list (QueryAll) and a single row (QueryRowContext).
type Scanner interface {
	Scan(dest ...any) error
}

// QueryEach runs query on q and calls each for every row, in order, stopping at the first
// error each returns. It closes the rows and returns the error that ended them early
// (rows.Err: a lost connection, or a statement that failed after its first rows), which a
// loop written by hand easily forgets, and would then take part of the result for the whole.
func QueryEach(ctx context.Context, q Executor, each func(Scanner) error, query string, args ...any) error {
	rows, err := q.QueryContext(ctx, query, args...)
	if err != nil {
		return err
	}
	defer rows.Close()
	for rows.Next() {
		if err := each(rows); err != nil {
			return err
		}
	}
	return rows.Err()
}

// QueryAll runs query on q and returns one value per row, made by scan, in the order of the
// rows, or nil and the error, as QueryEach does. No rows give an empty slice, not nil, so the
// result encodes as [] in JSON.
func QueryAll[T any](ctx context.Context, q Executor, scan func(Scanner) (T, error), query string, args ...any) ([]T, error) {
	out := []T{}
	err := QueryEach(ctx, q, func(s Scanner) error {
		v, err := scan(s)
		if err == nil {
			out = append(out, v)
		}
		return err
	}, query, args...)
	if err != nil {
		return nil, err
	}
	return out, nil
}
