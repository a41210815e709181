package pgtx

import (
	"context"
	"fmt"
)

// DistinctConsumers lists, in name order, the distinct values of the consumer column of table
// (a name from QualifiedName, never user text). It walks an index led by consumer one value at
// a time (a "loose index scan"): one index probe per consumer, not a scan of the table, so
// it stays cheap on tables of millions of claims or inbox rows. Without such an index it is
// a sequential scan per consumer.
func DistinctConsumers(ctx context.Context, q Executor, table string) ([]string, error) {
	out, err := QueryAll(ctx, q, scanString, `WITH RECURSIVE c(consumer) AS (
    (SELECT consumer FROM `+table+` ORDER BY consumer LIMIT 1)
    UNION ALL
    SELECT (SELECT t.consumer FROM `+table+` t WHERE t.consumer > c.consumer ORDER BY t.consumer LIMIT 1)
    FROM c WHERE c.consumer IS NOT NULL
)
SELECT consumer FROM c WHERE consumer IS NOT NULL`)
	if err != nil {
		return nil, fmt.Errorf("pgtx: consumers of %s: %w", table, err)
	}
	return out, nil
}

func scanString(s Scanner) (string, error) {
	var v string
	err := s.Scan(&v)
	return v, err
}
