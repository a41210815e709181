package inbox_test

import (
	"database/sql"
	"testing"

	"github.com/ThreeDotsLabs/watermill/message"
	"github.com/stretchr/testify/require"

	"github.com/wmonce/watermill-once/inbox"
	"github.com/wmonce/watermill-once/internal/pgtest"
)

// TxOptions that fail every processing transaction (issue 34, item 3) are refused at
// construction with the field named.
func TestProcessorTxOptionsThatCannotWorkAreRefused(t *testing.T) {
	t.Parallel()
	db := pgtest.DB(t)
	h := func(*message.Message) ([]*message.Message, error) { return nil, nil }
	for want, opts := range map[string]*sql.TxOptions{
		"TxOptions.ReadOnly must be false": {ReadOnly: true},
		"PostgreSQL has no SNAPSHOT":       {Isolation: sql.LevelSnapshot},
		"TxOptions.Isolation must be":      {Isolation: sql.LevelLinearizable},
	} {
		_, err := inbox.NewProcessor(db, h, inbox.ProcessorConfig{Consumer: "c", TxOptions: opts}, nil)
		require.ErrorContains(t, err, "inbox: invalid")
		require.ErrorContains(t, err, want)
	}
}
