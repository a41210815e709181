package oncetest

import (
	"context"
	"database/sql"
	"errors"
	"fmt"
	"sync"
	"sync/atomic"

	"github.com/ThreeDotsLabs/watermill/message"

	"github.com/wmonce/watermill-once/pgtx"
)

// Metadata the kit adds to the copies it delivers. The handler sees them; they say which
// delivery a copy is and what the kit does around it (the kit's own tests read
// "oncetest_delivery" to misbehave on one copy).
const (
	metadataDelivery = "oncetest_delivery" // "e<event>c<copy>", or a kit message's role
	metadataRole     = "oncetest_role"     // blocker, neighbour: kit messages the user's handler never sees
)

const (
	roleBlocker   = "blocker"
	roleNeighbour = "neighbour"
)

// errInjected is the transient failure the kit injects; errKilled wraps the error of the
// connection the kit terminates.
var (
	errInjected = errors.New("oncetest: injected transient failure")
	errKilled   = errors.New("oncetest: injected connection kill")
)

// commitFaultTable is the kit's table in the schema: a row written into it makes the COMMIT
// of its transaction terminate its own connection (a deferred constraint trigger), so the
// connection dies while PostgreSQL runs the COMMIT, deterministically.
const commitFaultTable = "oncetest_commit_fault"

func installCommitFault(ctx context.Context, db *sql.DB, schema string) error {
	table := pgtx.QualifiedName(schema, commitFaultTable)
	fn := pgtx.QualifiedName(schema, commitFaultTable+"_kill")
	// Several kits may install it at once: one advisory lock per schema serialises the DDL.
	stmts := []string{
		`CREATE TABLE IF NOT EXISTS ` + table + ` (id bigserial PRIMARY KEY)`,
		`CREATE OR REPLACE FUNCTION ` + fn + `() RETURNS trigger LANGUAGE plpgsql AS $$
BEGIN
	PERFORM pg_terminate_backend(pg_backend_pid());
	PERFORM pg_sleep(30); -- the termination arrives here
	RETURN NULL;
END $$`,
		`DROP TRIGGER IF EXISTS kill_at_commit ON ` + table,
		`CREATE CONSTRAINT TRIGGER kill_at_commit AFTER INSERT ON ` + table +
			` DEFERRABLE INITIALLY DEFERRED FOR EACH ROW EXECUTE FUNCTION ` + fn + `()`,
	}
	tx, err := db.BeginTx(ctx, nil)
	if err != nil {
		return fmt.Errorf("install the commit fault: %w", err)
	}
	defer func() { _ = tx.Rollback() }()
	if _, err := tx.ExecContext(ctx, `SELECT pg_advisory_xact_lock(hashtext($1))`, schema+".oncetest"); err != nil {
		return fmt.Errorf("install the commit fault: %w", err)
	}
	for _, s := range stmts {
		if _, err := tx.ExecContext(ctx, s); err != nil {
			return fmt.Errorf("install the commit fault in schema %s: %w", schema, err)
		}
	}
	if err := tx.Commit(); err != nil {
		return fmt.Errorf("install the commit fault: %w", err)
	}
	return nil
}

// injector wraps the user's handler inside the middleware (where a real handler runs: the
// transaction open, the claim taken) and injects one run's faults.
type injector struct {
	schema   string
	fault    Fault
	out      *outcome // what the handler did that a report shows: its errors, its own acks
	target   string   // the delivery whose first attempt gets the fault
	attempts sync.Map // delivery -> *atomic.Int32

	// shutdown closes the router (mode-specific) for FaultShutdown.
	shutdown func(delivery string)

	// group commit: blockers hold the lanes until release is closed.
	blockersStarted chan struct{}
	release         chan struct{}
}

func (in *injector) attempt(delivery string) int32 {
	v, _ := in.attempts.LoadOrStore(delivery, new(atomic.Int32))
	return v.(*atomic.Int32).Add(1)
}

// wrap puts the injector around h: kit messages never reach h, and the delivery the schedule
// names gets the fault after h returned (or, FaultShutdown, while h runs).
func (in *injector) wrap(h message.HandlerFunc) message.HandlerFunc {
	return func(msg *message.Message) ([]*message.Message, error) {
		delivery := msg.Metadata.Get(metadataDelivery)
		if kit, err := in.runKitMessage(msg, delivery); kit {
			return nil, err
		}
		hit := delivery == in.target && in.attempt(delivery) == 1
		if hit && in.fault == FaultShutdown {
			in.shutdown(delivery)
		}
		out, err := h(msg)
		return in.afterHandler(msg, delivery, hit, out, err)
	}
}

// afterHandler records what the handler did (its error, its own ack) and, on the delivery the
// schedule hits, injects the fault after the handler succeeded.
func (in *injector) afterHandler(msg *message.Message, delivery string, hit bool, out []*message.Message, err error) ([]*message.Message, error) {
	if err != nil {
		in.out.sawHandlerError(fmt.Errorf("delivery %s: %w", delivery, err))
	}
	in.noteSelfAck(msg, delivery)
	if err != nil || !hit {
		return out, err
	}
	return in.injectAfter(msg, out)
}

// runKitMessage runs a message of the kit's own in the user's handler's place and says whether
// msg was one: a blocker holds its group-commit lane until released, a neighbour fails its
// first attempt.
func (in *injector) runKitMessage(msg *message.Message, delivery string) (bool, error) {
	switch msg.Metadata.Get(metadataRole) {
	case roleBlocker:
		in.blockersStarted <- struct{}{}
		<-in.release
		return true, nil
	case roleNeighbour:
		if in.attempt(delivery) == 1 {
			return true, fmt.Errorf("oncetest: a neighbour's handler failed: %w", errInjected)
		}
		return true, nil
	}
	return false, nil
}

// noteSelfAck records a handler's own ack or nack. The ack belongs to the library: it acks
// after the commit. A handler's own ack (or nack) is a violation whether or not it reaches the
// broker.
func (in *injector) noteSelfAck(msg *message.Message, delivery string) {
	if closed(msg.Acked()) {
		in.out.sawSelfAck(delivery + " acked")
	} else if closed(msg.Nacked()) {
		in.out.sawSelfAck(delivery + " nacked")
	}
}

// injectAfter injects the schedule's fault into the hit delivery after its handler succeeded
// with out, inside the transaction the middleware lent.
func (in *injector) injectAfter(msg *message.Message, out []*message.Message) ([]*message.Message, error) {
	switch in.fault {
	case FaultTransient:
		return nil, errInjected
	case FaultKillMidHandler:
		return nil, in.exec(msg, `SELECT pg_terminate_backend(pg_backend_pid())`)
	case FaultKillDuringCommit:
		if err := in.exec(msg, `INSERT INTO `+pgtx.QualifiedName(in.schema, commitFaultTable)+` DEFAULT VALUES`); err != nil {
			return nil, err
		}
	}
	return out, nil
}

// exec runs query in the message's transaction. The error of a terminated connection is
// the attempt's failure.
func (in *injector) exec(msg *message.Message, query string) error {
	tx, ok := pgtx.TxFromContext(msg.Context())
	if !ok {
		return errors.New("oncetest: the message carries no transaction: the kit's fault cannot be injected")
	}
	if _, err := tx.ExecContext(msg.Context(), query); err != nil {
		return fmt.Errorf("%w: %w", errKilled, err)
	}
	return nil
}

func closed(ch <-chan struct{}) bool {
	select {
	case <-ch:
		return true
	default:
		return false
	}
}
