package once

import (
	"context"
	"errors"
	"fmt"
	"time"

	"github.com/ThreeDotsLabs/watermill"

	"github.com/wmonce/watermill-once/internal/partition"
)

// missingPartitionError asks the caller to create partitions and try again.
type missingPartitionError struct {
	days []time.Time
	err  error
}

func (e *missingPartitionError) Error() string {
	return fmt.Sprintf("once: a partition of processed_messages_daily is missing (days %v): %v", e.days, e.err)
}
func (e *missingPartitionError) Unwrap() error { return e.err }

// ensurePartition creates the partition err asks for, in a transaction of its own, and
// reports whether it did.
func (e *Middleware) ensurePartition(ctx context.Context, err error) bool {
	var mp *missingPartitionError
	if !errors.As(err, &mp) {
		return false
	}
	for _, day := range mp.days {
		if perr := partition.Ensure(ctx, e.db, e.config.Schema, day, day); perr != nil {
			e.logger.Error("Could not create partition", perr, watermill.LogFields{"day": day.Format(time.DateOnly)})
			return false
		}
	}
	return true
}
