package versioned

import (
	"cmp"
	"context"
	"database/sql"
	"errors"
	"fmt"

	wmonce "github.com/wmonce/watermill-once"
	"github.com/wmonce/watermill-once/internal/pgwire"
	"github.com/wmonce/watermill-once/internal/setup"
	"github.com/wmonce/watermill-once/internal/txguard"
	"github.com/wmonce/watermill-once/pgtx"
)

// ErrVersionGap is matched (errors.Is) by every *GapError.
var ErrVersionGap = errors.New("versioned: version gap")

// ErrInvalid is wrapped by the (permanent) errors about unusable input.
var ErrInvalid = errors.New("versioned: invalid input")

// GapError reports a delta that arrived before its predecessors: retryable.
type GapError struct {
	Entity Entity
	Stored int64 // the first version - 1 when nothing is stored yet
	Got    int64
}

func (e *GapError) Error() string {
	return fmt.Sprintf("versioned: %s has version %d stored; version %d must wait for version %d", e.Entity, e.Stored, e.Got, e.Stored+1)
}

// Is makes errors.Is(err, ErrVersionGap) true.
func (e *GapError) Is(target error) bool { return target == ErrVersionGap }

// Entity names what the versions count: one sequence per (Type, ID).
type Entity struct {
	Type string // e.g. "order"
	ID   string // e.g. "ord_9f3"
}

func (e Entity) String() string { return e.Type + "/" + e.ID }

func (e Entity) validate() error {
	for _, p := range [...]struct{ name, v string }{{"type", e.Type}, {"id", e.ID}} {
		switch {
		case p.v == "":
			return fmt.Errorf("entity %s is empty", p.name)
		case len(p.v) > 1024:
			return fmt.Errorf("entity %s is %d bytes long; it may be at most 1024 bytes", p.name, len(p.v))
		}
		if err := setup.CheckText("entity "+p.name, p.v); err != nil {
			return err
		}
	}
	return nil
}

// Outcome says what happened to an event.
type Outcome int

const (
	Applied Outcome = iota + 1 // the version was recorded and apply ran
	Stale                      // not newer than stored (a copy): apply did not run; ack it
)

func (o Outcome) String() string {
	switch o {
	case Applied:
		return "applied"
	case Stale:
		return "stale"
	}
	return fmt.Sprintf("Outcome(%d)", int(o))
}

// Result is the outcome of one call.
type Result struct {
	Outcome Outcome
	Stored  int64 // the entity's version after the call
}

// Config configures Versions.
type Config struct {
	// Schema holds the entity_versions table. Default pgtx.DefaultSchema.
	Schema string
	// StartAtZero: each entity's first version is 0. Default 1.
	StartAtZero bool
}

func (c *Config) setDefaults() {
	c.Schema = cmp.Or(c.Schema, pgtx.DefaultSchema)
}

// Validate reports a configuration that cannot work.
func (c Config) Validate() error {
	return pgtx.ValidateIdentifier("schema", c.Schema)
}

func (c Config) firstVersion() int64 {
	if c.StartAtZero {
		return 0
	}
	return 1
}

// Versions applies events in version order. It is safe for concurrent use.
type Versions struct {
	config                                                 Config
	first                                                  int64
	qInsertFirst, qAdvanceDelta, qAdvanceState, qGet, qSet string
}

// New returns Versions on config.Schema's entity_versions; it does not touch the database.
func New(config Config) (*Versions, error) {
	if err := setup.Config(&config, (*Config).setDefaults, "versioned: invalid config"); err != nil {
		return nil, err
	}
	t := pgtx.QualifiedName(config.Schema, "entity_versions")
	// Every use of the version is cast to bigint: left to inference, "$3 - 1" makes it int4,
	// and versions above 2^31-1 (millisecond timestamps) could not be sent.
	return &Versions{
		config:        config,
		first:         config.firstVersion(),
		qInsertFirst:  `INSERT INTO ` + t + ` (entity_type, entity_id, version) VALUES ($1, $2, $3::bigint) ON CONFLICT DO NOTHING RETURNING version`,
		qAdvanceDelta: `UPDATE ` + t + ` SET version = $3::bigint, updated_at = now() WHERE entity_type = $1 AND entity_id = $2 AND version = $3::bigint - 1 RETURNING version`,
		qAdvanceState: `INSERT INTO ` + t + ` AS v (entity_type, entity_id, version) VALUES ($1, $2, $3::bigint)
ON CONFLICT (entity_type, entity_id) DO UPDATE SET version = EXCLUDED.version, updated_at = now()
WHERE v.version < EXCLUDED.version RETURNING version`,
		qGet: `SELECT version FROM ` + t + ` WHERE entity_type = $1 AND entity_id = $2`,
		qSet: `INSERT INTO ` + t + ` AS v (entity_type, entity_id, version) VALUES ($1, $2, $3::bigint)
ON CONFLICT (entity_type, entity_id) DO UPDATE SET version = EXCLUDED.version, updated_at = now() RETURNING version`,
	}, nil
}

// ApplyDelta runs apply if version is the stored one + 1 (the first for a new entity) and
// records it; an older version is Stale, a later one a *GapError that changes nothing.
func (v *Versions) ApplyDelta(ctx context.Context, tx pgtx.Executor, e Entity, version int64, apply func(ctx context.Context) error) (Result, error) {
	query := v.qAdvanceDelta
	if version == v.first {
		query = v.qInsertFirst
	}
	return v.apply(ctx, tx, e, version, query, apply, func(stored int64) (Result, error) {
		if stored >= version {
			return Result{Outcome: Stale, Stored: stored}, nil
		}
		return Result{Stored: stored}, &GapError{Entity: e, Stored: stored, Got: version}
	})
}

// ApplyState runs apply if version is above the stored one (or the entity is new) and records
// it; anything else is Stale.
func (v *Versions) ApplyState(ctx context.Context, tx pgtx.Executor, e Entity, version int64, apply func(ctx context.Context) error) (Result, error) {
	return v.apply(ctx, tx, e, version, v.qAdvanceState, apply, func(stored int64) (Result, error) {
		return Result{Outcome: Stale, Stored: stored}, nil
	})
}

// apply moves e to version with query (an advance that returns the version when it moved)
// and runs apply; when the version did not move, notMoved decides the result from the stored
// version.
func (v *Versions) apply(ctx context.Context, tx pgtx.Executor, e Entity, version int64, query string, apply func(ctx context.Context) error, notMoved func(stored int64) (Result, error)) (Result, error) {
	if err := v.check(tx, e, version); err != nil {
		return Result{}, err
	}
	applied, err := v.advance(ctx, tx, query, e, version)
	if err != nil {
		return Result{}, err
	}
	if !applied {
		stored, err := v.current(ctx, tx, e)
		if err != nil {
			return Result{}, err
		}
		return notMoved(stored)
	}
	return v.run(ctx, tx, apply, e, version)
}

// Current returns the stored version of e, or the first version - 1 when there is none.
func (v *Versions) Current(ctx context.Context, q pgtx.Executor, e Entity) (int64, error) {
	if setup.IsNil(q) {
		return 0, errNilTx
	}
	if err := e.validate(); err != nil {
		return 0, wmonce.Permanent(fmt.Errorf("%w: %w", ErrInvalid, err))
	}
	return v.current(ctx, q, e)
}

// SetVersion stores version for e unconditionally: to unblock or seed an entity.
func (v *Versions) SetVersion(ctx context.Context, q pgtx.Executor, e Entity, version int64) error {
	if err := v.check(q, e, version); err != nil {
		return err
	}
	_, err := v.advance(ctx, q, v.qSet, e, version)
	return err
}

// errNilTx also covers the nil *sql.Tx that pgtx.TxFromContext returns outside a transaction.
var errNilTx = fmt.Errorf("versioned: %w: tx is nil: pass the handler's transaction (pgtx.TxFromContext)", pgtx.ErrNoTransaction)

func (v *Versions) check(tx pgtx.Executor, e Entity, version int64) error {
	if setup.IsNil(tx) {
		return errNilTx
	}
	if err := e.validate(); err != nil {
		return wmonce.Permanent(fmt.Errorf("%w: %w", ErrInvalid, err))
	}
	if version < v.first {
		return wmonce.Permanent(fmt.Errorf("%w: %s version %d is below the first version %d", ErrInvalid, e, version, v.first))
	}
	return nil
}

func (v *Versions) advance(ctx context.Context, tx pgtx.Executor, query string, e Entity, version int64) (bool, error) {
	var got int64
	err := tx.QueryRowContext(ctx, query, e.Type, e.ID, version).Scan(&got)
	if errors.Is(err, sql.ErrNoRows) {
		return false, nil
	}
	if ended := endedBefore(ctx, err); ended != nil {
		return false, fmt.Errorf("versioned: record %s version %d: %w", e, version, ended)
	}
	if err != nil {
		if pgtx.IsUndefinedTable(err) {
			return false, fmt.Errorf("versioned: table entity_versions is missing in schema %q: run the migrations: %w", v.config.Schema, err)
		}
		return false, fmt.Errorf("versioned: record %s version %d: %w", e, version, err)
	}
	return true, nil
}

func (v *Versions) current(ctx context.Context, q pgtx.Executor, e Entity) (int64, error) {
	var stored int64
	err := q.QueryRowContext(ctx, v.qGet, e.Type, e.ID).Scan(&stored)
	if errors.Is(err, sql.ErrNoRows) {
		return v.first - 1, nil
	}
	if ended := endedBefore(ctx, err); ended != nil {
		return 0, fmt.Errorf("versioned: read version of %s: %w", e, ended)
	}
	if err != nil {
		return 0, fmt.Errorf("versioned: read version of %s: %w", e, err)
	}
	return stored, nil
}

func (v *Versions) run(ctx context.Context, tx pgtx.Executor, apply func(ctx context.Context) error, e Entity, version int64) (Result, error) {
	if apply != nil {
		err := apply(ctx)
		if ended := endedBy(ctx, tx); ended != nil {
			if err != nil {
				ended = fmt.Errorf("%w (apply returned: %s)", ended, err.Error())
			}
			return Result{}, fmt.Errorf("versioned: apply %s version %d ended the caller's transaction: %w", e, version, ended)
		}
		if err != nil {
			return Result{}, fmt.Errorf("versioned: apply %s version %d: %w", e, version, err)
		}
	}
	return Result{Outcome: Applied, Stored: version}, nil
}

// checkTx is a statement that does nothing (a transaction-local setting of no schema's): sent
// in a transaction that user code has ended, database/sql answers sql.ErrTxDone without sending
// it. On a pool from pgtx.Open it waits for the transaction's next statement, so it costs no
// round trip.
const checkTx = pgwire.DeferredPrefix + "SET LOCAL wmonce.versioned_check = 'on'"

// endedBy returns the permanent error of an apply function that ended tx (Commit or Rollback
// on it), or nil. Only a *sql.Tx can be asked; any other pgtx.Executor is taken as still open.
func endedBy(ctx context.Context, tx pgtx.Executor) error {
	t, ok := tx.(*sql.Tx)
	if !ok {
		return nil
	}
	_, err := t.ExecContext(ctx, checkTx)
	return endedBefore(ctx, err)
}

// endedBefore returns the permanent error of a transaction that user code ended before the
// statement whose error is err was sent (sql.ErrTxDone while ctx is alive: a context that ended
// rolls the transaction back itself, which is nobody's fault), or nil.
//
// In a transaction lent by the library (an effectively-once handler's, the inbox Processor's,
// httpidem's) the attempt guard refused a COMMIT of user code: nothing of it is applied and the
// library parks the message or fails the request. In a transaction of the caller's own, what
// was applied is what that Commit or Rollback did.
func endedBefore(ctx context.Context, err error) error {
	if !txguard.IsEnded(ctx, err) {
		return nil
	}
	return txguard.Ended(err)
}
