package outbox

import (
	"context"
	"database/sql"
	"errors"
	"fmt"

	wmonce "github.com/wmonce/watermill-once"
	"github.com/wmonce/watermill-once/pgtx"
)

// RepublishRequest selects rejected rows of one relay to store again in the outbox.
type RepublishRequest struct {
	// Relay is the relay that rejected the rows (RejectedRow.Relay). Required.
	Relay string
	// Offsets are the rejected rows' outbox offsets (RejectedRow.Offset). Give them, or All.
	Offsets []int64
	// All selects every row the relay rejected.
	All bool
	// RemoveMetadata names metadata keys removed from each message before it is stored again:
	// for a row refused because of its metadata, such as a key the broker reserves
	// (_watermill_message_uuid on Kafka). Nothing else is changed.
	RemoveMetadata []string
	// DryRun counts what would be republished and changes nothing.
	DryRun bool
}

// RepublishResult says what RepublishRejected did (or, for a dry run, would do).
type RepublishResult struct {
	// Republished counts the rows stored again in the outbox and removed from outbox_rejected.
	Republished int
	// Undecodable lists the offsets of selected rows that are not a message the relay can
	// decode: republishing them would only reject them again, so they stay in outbox_rejected.
	Undecodable []int64
}

// RepublishRejected stores the selected rows of outbox_rejected in the outbox again, as new
// rows (same UUID, payload and metadata, less RemoveMetadata, and the same source) at the end of
// the outbox, and removes them from outbox_rejected, all in one transaction; idle relays are
// woken when it commits. Fix what made the broker refuse them first (create the topic, raise
// the size limit, remove the reserved key): a row refused again is rejected again.
//
// The new rows are forwarded by every relay of their source, after every row committed before
// them: a later row of the same key that went on while the row was set aside is now before it,
// and a relay that had forwarded the original (another relay name) forwards a copy, which
// consumers deduplicate by UUID.
func RepublishRejected(ctx context.Context, db *sql.DB, schema string, req RepublishRequest) (RepublishResult, error) {
	if err := checkRelayName("republish rejected", db, &schema, req.Relay); err != nil {
		return RepublishResult{}, err
	}
	if len(req.Offsets) == 0 && !req.All {
		return RepublishResult{}, errors.New("outbox: republish rejected: give the offsets of the rows to republish, or All")
	}
	if len(req.Offsets) > 0 && req.All {
		return RepublishResult{}, errors.New("outbox: republish rejected: give offsets or All, not both")
	}
	for _, k := range req.RemoveMetadata {
		if err := wmonce.CheckName("metadata key to remove", k); err != nil {
			return RepublishResult{}, fmt.Errorf("outbox: republish rejected: %w", err)
		}
	}
	rejected := pgtx.QualifiedName(schema, "outbox_rejected")
	var res RepublishResult
	err := pgtx.RunInTx(ctx, db, nil, pgtx.RetryPolicy{}, func(ctx context.Context, tx *sql.Tx) error {
		res = RepublishResult{}
		rows, err := tx.QueryContext(ctx, `SELECT "offset", uuid, source, payload::text, metadata::text FROM `+rejected+`
WHERE relay = $1 AND ($2 OR "offset" = ANY($3::bigint[])) ORDER BY "offset" FOR UPDATE`, req.Relay, req.All, req.Offsets)
		if err != nil {
			return err
		}
		defer rows.Close() // closed below before the INSERT; the deferred call is then a no-op
		var offsets []int64
		var uuids, sources, payloads, metadatas []string
		for rows.Next() {
			var offset int64
			var uuid, source string
			var payload, metadata sql.NullString
			if err := rows.Scan(&offset, &uuid, &source, &payload, &metadata); err != nil {
				return err
			}
			env, md, ok := republishable(payload, metadata, req.RemoveMetadata)
			if !ok {
				res.Undecodable = append(res.Undecodable, offset)
				continue
			}
			offsets = append(offsets, offset)
			uuids, sources, payloads, metadatas = append(uuids, uuid), append(sources, source), append(payloads, env), append(metadatas, md)
		}
		if err := rows.Err(); err != nil {
			return err
		}
		if err := rows.Close(); err != nil { // the connection is needed for the INSERT
			return err
		}
		res.Republished = len(offsets)
		if req.DryRun || len(offsets) == 0 {
			return nil
		}
		if _, err := tx.ExecContext(ctx, `INSERT INTO `+pgtx.QualifiedName(schema, "outbox")+` (uuid, payload, metadata, transaction_id, source)
SELECT u, p::json, m::json, pg_current_xact_id(), s
FROM unnest($1::text[], $2::text[], $3::text[], $4::text[]) WITH ORDINALITY AS x(u, p, m, s, n) ORDER BY n`,
			uuids, payloads, metadatas, sources); err != nil {
			return err
		}
		if _, err := tx.ExecContext(ctx, `DELETE FROM `+rejected+` WHERE relay = $1 AND "offset" = ANY($2::bigint[])`, req.Relay, offsets); err != nil {
			return err
		}
		_, err = tx.ExecContext(ctx, `SELECT pg_notify($1, '')`, relayChannel(schema))
		return err
	})
	if err != nil {
		return RepublishResult{}, fmt.Errorf("outbox: republish rejected: %w", err)
	}
	return res, nil
}

// republishable returns the envelope and metadata to store for a rejected row, with the keys
// in remove removed; ok is false for a row that is not an envelope the relay can decode.
// Without keys to remove, the row's own JSON is stored again, byte for byte.
func republishable(payload, metadata sql.NullString, remove []string) (env, md string, ok bool) {
	if !payload.Valid {
		return "", "", false
	}
	topic, msg, err := unmarshalEnvelope([]byte(payload.String))
	if err != nil {
		return "", "", false
	}
	if len(remove) == 0 {
		md = metadata.String
		if !metadata.Valid {
			md = "{}"
		}
		return payload.String, md, true
	}
	for _, k := range remove {
		delete(msg.Metadata, k)
	}
	b, err := marshalEnvelope(topic, msg)
	if err != nil {
		return "", "", false
	}
	if md, err = jsonMetadata(msg.Metadata); err != nil {
		return "", "", false
	}
	return string(b), md, true
}
