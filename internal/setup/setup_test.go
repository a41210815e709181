package setup_test

import (
	"database/sql"
	"errors"
	"testing"

	"github.com/ThreeDotsLabs/watermill"
	"github.com/stretchr/testify/require"

	"github.com/wmonce/watermill-once/internal/setup"
)

type config struct{ Size int }

func (c *config) setDefaults() {
	if c.Size == 0 {
		c.Size = 3
	}
}

func (c config) Validate() error {
	if c.Size > 10 {
		return errors.New("Size must be at most 10")
	}
	return nil
}

func TestComponent(t *testing.T) {
	t.Parallel()
	db := &sql.DB{} // never used: the helper only checks it is not nil

	// A nil db is reported before an invalid config.
	bad := config{Size: 11}
	_, err := setup.Component(nil, "x: db is nil", &bad, (*config).setDefaults, "x: invalid config", nil)
	require.EqualError(t, err, "x: db is nil")

	_, err = setup.Component(db, "x: db is nil", &bad, (*config).setDefaults, "x: invalid config", nil)
	require.EqualError(t, err, "x: invalid config: Size must be at most 10")

	// Defaults are filled in the caller's config before it is validated; a nil logger becomes
	// a no-op one, a given logger is kept.
	var c config
	logger, err := setup.Component(db, "x: db is nil", &c, (*config).setDefaults, "x: invalid config", nil)
	require.NoError(t, err)
	require.Equal(t, 3, c.Size)
	require.Equal(t, watermill.NopLogger{}, logger)
	given := watermill.NewStdLogger(false, false)
	logger, err = setup.Component(db, "x: db is nil", &c, (*config).setDefaults, "x: invalid config", given)
	require.NoError(t, err)
	require.Same(t, given, logger)
}
