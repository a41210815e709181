package outbox

import (
	"context"
	"database/sql"
	"errors"
	"fmt"

	"github.com/ThreeDotsLabs/watermill/message"

	"github.com/wmonce/watermill-once/internal/outboxops"
	"github.com/wmonce/watermill-once/internal/setup"
	"github.com/wmonce/watermill-once/pgtx"
)

// republishRejected is outboxops.RepublishRejected. The rows are stored by the Writer's own
// insert (a Writer of the row's source), so they carry every column a PublishTx row carries,
// and are not stamped again; they are locked first, so that of concurrent calls for the same
// rows one republishes them and the others report none.
func republishRejected(ctx context.Context, db *sql.DB, schema string, req outboxops.RepublishRequest) (outboxops.RepublishResult, error) {
	if err := checkRelayName("republish rejected", db, &schema, req.Relay); err != nil {
		return outboxops.RepublishResult{}, err
	}
	if err := checkRepublishRequest(req); err != nil {
		return outboxops.RepublishResult{}, err
	}
	rejected := pgtx.QualifiedName(schema, "outbox_rejected")
	var res outboxops.RepublishResult
	err := pgtx.RunInTx(ctx, db, nil, pgtx.RetryPolicy{}, func(ctx context.Context, tx *sql.Tx) error {
		res = outboxops.RepublishResult{Offsets: []int64{}}
		// The original row, while retention keeps it, gives the partition key it was stored with.
		rows, err := pgtx.QueryAll(ctx, tx, scanRejectedCopy, `SELECT r."offset", r.source, r.payload::text, coalesce(o.partition_key, '')
FROM `+rejected+` r LEFT JOIN `+pgtx.QualifiedName(schema, "outbox")+` o ON o."offset" = r."offset" AND o.uuid = r.uuid
WHERE r.relay = $1 AND ($2 OR r."offset" = ANY($3::bigint[])) ORDER BY r."offset" FOR UPDATE OF r`, req.Relay, req.All, nonNil(req.Offsets))
		if err != nil {
			return err
		}
		writers, copies := prepareCopies(rows, schema, req, &res)
		res.Republished = len(copies)
		if req.DryRun || len(copies) == 0 {
			return nil
		}
		deleted, err := pgtx.QueryAll(ctx, tx, scanOffset, `DELETE FROM `+rejected+` WHERE relay = $1 AND "offset" = ANY($2::bigint[]) RETURNING "offset"`, req.Relay, res.Offsets)
		if err != nil {
			return err
		}
		if len(deleted) != len(copies) { // the rows are locked: only a broken invariant gets here
			return fmt.Errorf("deleted %d of the %d rejected rows locked for republishing", len(deleted), len(copies))
		}
		if err := storeCopies(ctx, tx, writers, copies); err != nil {
			return err
		}
		_, err = tx.ExecContext(ctx, `SELECT pg_notify($1, '')`, relayChannel(schema))
		return err
	})
	if err != nil {
		return outboxops.RepublishResult{}, fmt.Errorf("outbox: republish rejected: %w", err)
	}
	return res, nil
}

// checkRepublishRequest refuses a request that names no rows, names them twice over, or a
// metadata key that is not a plain name.
func checkRepublishRequest(req outboxops.RepublishRequest) error {
	if (len(req.Offsets) > 0) == req.All {
		return errors.New("outbox: republish rejected: give the offsets of the rows to republish, or All (not both)")
	}
	for _, k := range req.RemoveMetadata {
		if err := setup.CheckName("metadata key to remove", k); err != nil {
			return fmt.Errorf("outbox: republish rejected: %w", err)
		}
	}
	return nil
}

// prepareCopies prepares each row with a Writer of its source, one per source; the rows that
// cannot be stored go to res.Undecodable, the others to the copies and res.Offsets.
func prepareCopies(rows []rejectedCopy, schema string, req outboxops.RepublishRequest, res *outboxops.RepublishResult) (map[string]*Writer, []rejectedCopy) {
	writers := map[string]*Writer{}
	var copies []rejectedCopy
	for _, r := range rows {
		w, ok := writers[r.source]
		if !ok {
			// A source the Writer refuses makes the row unstorable, not the call a failure.
			w, _ = NewWriter(Config{Schema: schema, Source: r.source, PartitionKeyField: req.PartitionKeyField})
			writers[r.source] = w
		}
		if !r.prepare(w, req.RemoveMetadata) {
			res.Undecodable = append(res.Undecodable, r.offset)
			continue
		}
		copies = append(copies, r)
		res.Offsets = append(res.Offsets, r.offset)
	}
	return writers, copies
}

// storeCopies stores the copies in offset order, a run of one source and topic in one store.
func storeCopies(ctx context.Context, tx *sql.Tx, writers map[string]*Writer, copies []rejectedCopy) error {
	for i := 0; i < len(copies); {
		j := i + 1
		for j < len(copies) && copies[j].source == copies[i].source && copies[j].topic == copies[i].topic {
			j++
		}
		msgs, keys := make([]*message.Message, 0, j-i), make([]string, 0, j-i)
		for _, c := range copies[i:j] {
			msgs, keys = append(msgs, c.msg), append(keys, c.key)
		}
		if err := writers[copies[i].source].store(ctx, tx, copies[i].topic, msgs, false, keys); err != nil {
			return err
		}
		i = j
	}
	return nil
}

// rejectedCopy is one row of outbox_rejected as republishing reads it, and, once prepared,
// the message to store again.
type rejectedCopy struct {
	offset  int64
	source  string
	payload sql.NullString
	key     string // the original row's partition_key; "" once it is gone (or was NULL)
	topic   string
	msg     *message.Message
}

func scanRejectedCopy(s pgtx.Scanner) (rejectedCopy, error) {
	var r rejectedCopy
	err := s.Scan(&r.offset, &r.source, &r.payload, &r.key)
	return r, err
}

func scanOffset(s pgtx.Scanner) (int64, error) {
	var o int64
	err := s.Scan(&o)
	return o, err
}

// prepare decodes the row's envelope into the message to store, with the keys in remove
// removed; false for a row that is not an envelope the relay can decode, or that w (nil: its
// source is refused) would refuse.
func (r *rejectedCopy) prepare(w *Writer, remove []string) bool {
	if w == nil || !r.payload.Valid {
		return false
	}
	topic, msg, err := unmarshalEnvelope([]byte(r.payload.String))
	if err != nil {
		return false
	}
	for _, k := range remove {
		delete(msg.Metadata, k)
	}
	if w.checkBatch(topic, []*message.Message{msg}, false) != nil { // what the Writer would refuse
		return false
	}
	r.topic, r.msg = topic, msg
	return true
}
