package setup_test

import (
	"database/sql"
	"errors"
	"testing"
	"time"

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

func TestBetweenAndAtLeast(t *testing.T) {
	t.Parallel()
	require.NoError(t, setup.Between("BatchSize", 1, 1, 10))
	require.NoError(t, setup.Between("BatchSize", 10, 1, 10))
	require.EqualError(t, setup.Between("BatchSize", 11, 1, 10), "BatchSize must be between 1 and 10, got 11")
	require.EqualError(t, setup.Between("BatchSize", 0, 1, 10), "BatchSize must be between 1 and 10, got 0")
	require.NoError(t, setup.AtLeast("Lease", 10*time.Millisecond, 10*time.Millisecond))
	require.EqualError(t, setup.AtLeast("Lease", time.Millisecond, 10*time.Millisecond), "Lease must be at least 10ms, got 1ms")
}

func TestNotNegative(t *testing.T) {
	t.Parallel()
	require.NoError(t, setup.NotNegative("Linger", time.Duration(0)))
	require.EqualError(t, setup.NotNegative("Linger", -time.Second), "Linger must not be negative, got -1s")
}

func TestPositiveCheckEach(t *testing.T) {
	t.Parallel()
	require.NoError(t, setup.Positive("Lease", time.Second))
	require.EqualError(t, setup.Positive("Lease", time.Duration(0)), "Lease must be positive, got 0s")
	require.NoError(t, setup.Check(true, "never %d", 1))
	require.EqualError(t, setup.Check(false, "Header %q is not a header name", "a b"), `Header "a b" is not a header name`)
	require.NoError(t, setup.Each([]int{1, 2}, func(v int) error { return setup.Positive("v", v) }))
	require.EqualError(t, setup.Each([]int{-1, 2, 0}, func(v int) error { return setup.Positive("v", v) }),
		"v must be positive, got -1\nv must be positive, got 0")
}
