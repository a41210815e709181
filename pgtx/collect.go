package pgtx

import (
	"context"
)

// Scanner is *sql.Rows or *sql.Row: one scan function serves QueryAll and QueryRowContext.
type Scanner interface {
	Scan(dest ...any) error
}

// QueryEach runs query on q and calls each for every row, in order, stopping at the first
// error each returns. It closes the rows and returns rows.Err (a lost connection, a statement
// that failed after its first rows), which a loop written by hand easily forgets.
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

// QueryAll runs query on q and returns one value per row, made by scan, as QueryEach does. No
// rows give an empty slice, not nil (it encodes as [] in JSON).
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
