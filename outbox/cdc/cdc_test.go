package cdc_test

import (
	"context"
	"database/sql"
	"errors"
	"fmt"
	"net/url"
	"os"
	"strings"
	"testing"
	"time"

	"github.com/ThreeDotsLabs/watermill/message"
	"github.com/stretchr/testify/require"
	"github.com/twmb/franz-go/pkg/kgo"
	"github.com/twmb/franz-go/pkg/kmsg"

	wmonce "github.com/wmonce/watermill-once"
	"github.com/wmonce/watermill-once/broker"
	"github.com/wmonce/watermill-once/internal/brokertest"
	"github.com/wmonce/watermill-once/internal/outboxops"
	"github.com/wmonce/watermill-once/internal/pgtest"
	"github.com/wmonce/watermill-once/internal/testwait"
	"github.com/wmonce/watermill-once/ops/retention"
	"github.com/wmonce/watermill-once/outbox"
	"github.com/wmonce/watermill-once/outbox/cdc"
	"github.com/wmonce/watermill-once/pgtx"
)

func TestMain(m *testing.M) { pgtest.Main(m) }

// The configuration says what the issue asks for by default: exactly-once required, a 10 ms
// poll, pgoutput with our publication, the raw payload, the router on the columns of
// migration 013. Bad input fails saying what to fix.
func TestConnectorConfigDefaults(t *testing.T) {
	c, err := cdc.ConnectorConfig(cdc.Config{Schema: "shop", DatabaseURL: "postgres://app:secret@db.internal:6432/prod", User: "wmonce_cdc"})
	require.NoError(t, err)
	for k, v := range map[string]string{
		"tasks.max": "1", "exactly.once.support": "required", "poll.interval.ms": "10", "plugin.name": "pgoutput",
		"publication.name": "wmonce_outbox_shop", "publication.autocreate.mode": "disabled", "slot.name": "wmonce_shop",
		"table.include.list": "shop.outbox", "snapshot.mode": "no_data", "database.hostname": "db.internal",
		"database.port": "6432", "database.dbname": "prod", "database.user": "wmonce_cdc", "database.password": "secret",
		"value.converter":                                     "io.debezium.converters.BinaryDataConverter",
		"transforms.outbox.route.by.field":                    "destination",
		"transforms.outbox.route.topic.replacement":           "${routedByValue}",
		"transforms.outbox.table.field.event.id":              "uuid",
		"transforms.outbox.table.field.event.key":             "partition_key",
		"transforms.outbox.table.field.event.payload":         "payload_bytes",
		"transforms.outbox.table.fields.additional.placement": "metadata:header:metadata",
		"topic.prefix": "wmonce-outbox-shop",
	} {
		require.Equal(t, v, c[k], k)
	}
	off, err := cdc.ConnectorConfig(cdc.Config{DatabaseURL: "postgres://u@h/d", DisableExactlyOnce: true})
	require.NoError(t, err)
	require.NotContains(t, off, "exactly.once.support")
	require.Equal(t, "wmonce.outbox", off["table.include.list"])

	_, err = cdc.ConnectorConfig(cdc.Config{Schema: "Bad-Schema", DatabaseURL: "mysql://x"})
	require.ErrorContains(t, err, `cdc: invalid config`)
	require.ErrorContains(t, err, `schema name "Bad-Schema" is not allowed`)
	require.ErrorContains(t, err, `is not postgres://user@host:port/database`)
}

// A password reference takes the place of the URL's password in database.password; a
// malformed reference, or one beside a password in the URL, is refused.
func TestConnectorConfigTakesAPasswordReference(t *testing.T) {
	ref := "${file:/etc/wmonce/cdc.properties:password}"
	c, err := cdc.ConnectorConfig(cdc.Config{DatabaseURL: "postgres://wmonce_cdc@db:5432/prod", PasswordReference: ref})
	require.NoError(t, err)
	require.Equal(t, ref, c["database.password"])
	for name, cfg := range map[string]cdc.Config{
		"not a variable":     {DatabaseURL: "postgres://u@h/d", PasswordReference: "secret"},
		"unclosed":           {DatabaseURL: "postgres://u@h/d", PasswordReference: "${env:PW"},
		"no key":             {DatabaseURL: "postgres://u@h/d", PasswordReference: "${env}"},
		"and a URL password": {DatabaseURL: "postgres://u:secret@h/d", PasswordReference: "${env:PW}"},
	} {
		_, err := cdc.ConnectorConfig(cfg)
		require.ErrorContains(t, err, "PasswordReference", name)
		require.NotContains(t, err.Error(), "secret@", name)
	}
}

// connectURL is the Connect cluster the tests register connectors on.
func connectURL() string {
	if u := os.Getenv("CONNECT_URL"); u != "" {
		return u
	}
	return cdc.DefaultConnectURL
}

// connectKafka is the Kafka cluster the Connect workers write to: CONNECT_KAFKA_BROKERS, else
// the Kafka 4 broker of e2e/services (KAFKA_BROKERS may name another cluster).
func connectKafka() []string {
	if v := os.Getenv("CONNECT_KAFKA_BROKERS"); v != "" {
		return strings.Split(v, ",")
	}
	return []string{"127.0.0.1:9094"}
}

// startConnector registers a connector for schema and waits until its task reads the slot;
// the connector, slot and publication are removed when t ends.
func startConnector(t *testing.T, db *sql.DB, schema string) (cdc.Client, cdc.Config) {
	t.Helper()
	return startConnectorWith(t, db, cdc.Config{Schema: schema, DatabaseURL: pgtest.URL(), User: cdc.DefaultReplicationRole, TopicPartitions: 2})
}

// startConnectorWith is startConnector for a configuration of the test's own.
func startConnectorWith(t *testing.T, db *sql.DB, cfg cdc.Config) (cdc.Client, cdc.Config) {
	t.Helper()
	brokertest.SkipShort(t, "a Kafka Connect cluster with Debezium (e2e/services up connect)")
	client := cdc.Client{URL: connectURL()}
	ctx := context.Background()
	if _, err := client.Status(ctx, "none"); err != nil && !cdc.IsNotFound(err) {
		t.Fatalf("Kafka Connect is not reachable at %s (start it with e2e/services up connect, or set CONNECT_URL): %v", client.URL, err)
	}
	cfg = cfg.WithDefaults()
	require.NoError(t, cdc.Prepare(ctx, db, cfg))
	require.NoError(t, client.Apply(ctx, cfg))
	t.Cleanup(func() {
		ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
		defer cancel()
		require.NoError(t, cdc.Remove(ctx, client, db, cfg))
	})
	testwait.UntilWithin(t, 2*time.Minute, "the connector's task to run and read its slot", func() bool {
		s, err := client.Status(ctx, cfg.Name)
		if err == nil && len(s.Tasks) > 0 && s.Tasks[0].State.State == "FAILED" {
			t.Fatalf("the connector's task failed: %s", s.Tasks[0].Trace)
		}
		slot, serr := cdc.Slot(ctx, db, cfg)
		require.NoError(t, serr)
		return err == nil && s.Running() && slot.Active
	})
	return client, cfg
}

// The role and password e2e/services (and docker-compose.yml) set up for the password
// reference: PostgreSQL asks this role, and only it, for its password, and the Connect workers
// hold the password in their environment.
const (
	passwordRole     = "wmonce_cdc_password"
	passwordEnv      = "WMONCE_CDC_TEST_PASSWORD"
	passwordOfWorker = "wmonce-dev-only-cdc-password"
)

// With a PasswordReference the connector logs in with a password the workers resolve, and
// Connect's copy of the configuration holds the reference, not the password.
func TestConnectorLogsInThroughAPasswordReference(t *testing.T) {
	t.Parallel()
	db := pgtest.DB(t)
	schema := pgtest.Schema(t, db)
	ctx := context.Background()
	pgtest.Exec(t, db, `ALTER ROLE `+passwordRole+` PASSWORD '`+passwordOfWorker+`'`)
	u, err := url.Parse(pgtest.URL())
	require.NoError(t, err)
	// Without a password check the connector's login would prove nothing.
	u.User = url.UserPassword(passwordRole, "not-"+passwordOfWorker)
	wrong, err := pgtx.Open(ctx, u.String(), pgtx.PoolConfig{})
	if err == nil {
		err = wrong.PingContext(ctx)
		_ = wrong.Close()
	}
	if err == nil || !strings.Contains(err.Error(), "password authentication failed") {
		t.Fatalf("PostgreSQL let %s log in with a wrong password (%v): its pg_hba.conf needs 'host all %s 127.0.0.1/32 scram-sha-256' above the trust lines; e2e/services up adds it", passwordRole, err, passwordRole)
	}

	u.User = url.User(passwordRole)
	ref := "${env:" + passwordEnv + "}"
	client, cfg := startConnectorWith(t, db, cdc.Config{Schema: schema, DatabaseURL: u.String(), User: passwordRole, PasswordReference: ref, TopicPartitions: 2})
	stored, err := client.Config(ctx, cfg.Name)
	require.NoError(t, err)
	require.Equal(t, ref, stored["database.password"])
	for k, v := range stored {
		require.NotContains(t, v, passwordOfWorker, "Connect holds the password in %s", k)
	}

	// A reference the workers cannot resolve: Connect refuses the configuration (500), and
	// the error names the reference.
	unreadable := cfg
	unreadable.Name += "-unreadable"
	unreadable.PasswordReference = "${file:/nonexistent/wmonce-cdc.properties:password}"
	err = client.Apply(ctx, unreadable)
	t.Cleanup(func() { _ = client.Delete(context.Background(), unreadable.Name) })
	require.ErrorContains(t, err, "Could not read properties from file")
	require.ErrorContains(t, err, "could not resolve the password reference "+unreadable.PasswordReference)
}

// Debezium's records come back as the messages the producer stored: the UUID, the metadata
// (trace context, correlation, partition key) and the payload byte for byte, with Debezium's
// headers left out, in commit order per key; the Kafka subscriber of package broker reads them
// with no setting.
func TestDebeziumDeliversTheStoredMessages(t *testing.T) {
	t.Parallel()
	db := pgtest.DB(t)
	schema := pgtest.Schema(t, db)
	client, cfg := startConnector(t, db, schema)
	ctx := context.Background()
	// The Kafka the workers write to is the one connectKafka names.
	clusterID, err := client.KafkaClusterID(ctx)
	require.NoError(t, err)
	kc, err := kgo.NewClient(kgo.SeedBrokers(connectKafka()...))
	require.NoError(t, err)
	meta, err := kmsg.NewPtrMetadataRequest().RequestWith(ctx, kc)
	kc.Close()
	require.NoError(t, err)
	require.NotNil(t, meta.ClusterID)
	require.Equal(t, *meta.ClusterID, clusterID)
	topic := "cdc-" + strings.ReplaceAll(schema, "_", "-")
	b, err := broker.New(ctx, nil, broker.Config{Kind: broker.Kafka, Kafka: broker.KafkaConfig{Brokers: connectKafka()}}, nil)
	require.NoError(t, err)
	t.Cleanup(func() { brokertest.DeleteCreatedKafkaTopics(t, b); _ = b.Close() })
	group := "g-" + schema
	require.NoError(t, b.Declare(ctx, broker.Subscription{Topic: topic, Group: group}))
	sub, err := b.NewSubscriber(group)
	require.NoError(t, err)
	t.Cleanup(func() { _ = sub.Close() })
	ch, err := sub.Subscribe(ctx, topic)
	require.NoError(t, err)

	w, err := outbox.NewWriter(outbox.Config{Schema: schema})
	require.NoError(t, err)
	const keys, perKey = 3, 20
	want := map[string]*message.Message{}
	for i := range perKey {
		err := pgtx.RunInTx(ctx, db, nil, pgtx.RetryPolicy{}, func(ctx context.Context, tx *sql.Tx) error {
			var msgs []*message.Message
			for k := range keys {
				m := message.NewMessage(fmt.Sprintf("k%d-%03d", k, i), []byte{0xff, byte(k), byte(i), 0x00, 'z'})
				m.Metadata.Set("partition_key", fmt.Sprintf("key-%d", k))
				m.Metadata.Set("traceparent", "00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01")
				want[m.UUID] = m
				msgs = append(msgs, m)
			}
			return w.PublishTx(ctx, tx, topic, msgs...)
		})
		require.NoError(t, err)
	}
	last := map[string]int{}
	for range keys * perKey {
		m := testwait.Receive(t, ch, "a record of Debezium")
		w, ok := want[m.UUID]
		require.True(t, ok, "unexpected message %q (metadata %v)", m.UUID, m.Metadata)
		require.Equal(t, []byte(w.Payload), []byte(m.Payload), m.UUID)
		require.Equal(t, w.Metadata, m.Metadata, "the stored metadata, no Debezium header")
		var k, i int
		_, err := fmt.Sscanf(m.UUID, "k%d-%d", &k, &i)
		require.NoError(t, err)
		require.Equal(t, last[w.Metadata.Get("partition_key")], i, "per-key commit order")
		last[w.Metadata.Get("partition_key")] = i + 1
		m.Ack()
		delete(want, m.UUID)
	}
	require.Empty(t, want)

	// Retention: the janitor advances the slot's position (registered by Prepare) and deletes
	// the delivered rows. The round below takes a mark after them; once Debezium has delivered
	// a later row, the slot has confirmed past the mark.
	ob := pgtx.QualifiedName(schema, "outbox")
	pgtest.Exec(t, db, `UPDATE `+ob+` SET created_at = created_at - interval '2 days'`)
	j, err := retention.NewJanitor(db, retention.Config{Schema: schema, CDCSlots: []string{cfg.SlotName}}, nil)
	require.NoError(t, err)
	_, err = j.RunOnce(ctx)
	require.NoError(t, err)
	require.NoError(t, w.PublishTx(ctx, db, topic, message.NewMessage("later", []byte("z"))))
	require.Equal(t, "later", testwait.Receive(t, ch, "the later record").UUID)
	testwait.UntilWithin(t, 2*time.Minute, "the janitor to delete the rows Debezium delivered", func() bool {
		_, err := j.RunOnce(ctx)
		require.NoError(t, err)
		return pgtest.Count(t, db, `SELECT count(*) FROM `+ob+` WHERE uuid <> 'later'`) == 0
	})
}

// refusingPublisher refuses every message for good, as a broker refuses one too large.
type refusingPublisher struct{}

func (refusingPublisher) Publish(string, ...*message.Message) error {
	return wmonce.Permanent(errors.New("kafka server: Message was too large, server rejected it"))
}
func (refusingPublisher) Close() error { return nil }

// A row a relay rejected and an operator republished (outboxops.RepublishRejected, behind `wmonce
// outbox republish` and `wmonce failures replay`) is read by Debezium like any other, and so is
// every row after it. Before, the republished row had NULL destination, partition_key and
// payload_bytes: Debezium's task failed on it (NullPointerException) and nothing after it
// reached the consumers.
func TestDebeziumReadsARepublishedRow(t *testing.T) {
	t.Parallel()
	db := pgtest.DB(t)
	schema := pgtest.Schema(t, db)
	client, cfg := startConnector(t, db, schema)
	ctx := context.Background()
	topic := "cdc-rp-" + strings.ReplaceAll(schema, "_", "-")
	b, err := broker.New(ctx, nil, broker.Config{Kind: broker.Kafka, Kafka: broker.KafkaConfig{Brokers: connectKafka()}}, nil)
	require.NoError(t, err)
	t.Cleanup(func() { brokertest.DeleteCreatedKafkaTopics(t, b); _ = b.Close() })
	group := "g-" + schema
	require.NoError(t, b.Declare(ctx, broker.Subscription{Topic: topic, Group: group}))
	sub, err := b.NewSubscriber(group)
	require.NoError(t, err)
	t.Cleanup(func() { _ = sub.Close() })
	ch, err := sub.Subscribe(ctx, topic)
	require.NoError(t, err)
	receive := func(what string) *message.Message {
		t.Helper()
		m := testwait.Receive(t, ch, what)
		m.Ack()
		return m
	}

	w, err := outbox.NewWriter(outbox.Config{Schema: schema})
	require.NoError(t, err)
	big := message.NewMessage("big-1", []byte("a large record"))
	big.Metadata.Set("partition_key", "account-7")
	require.NoError(t, w.PublishTx(ctx, db, topic, big))
	require.Equal(t, "big-1", receive("the original row").UUID)

	// A relay of the same outbox (before the switch to Debezium, or beside it) was refused the
	// row for good and set it aside; the operator republishes it.
	relay, err := outbox.NewRelay(db, refusingPublisher{}, outbox.RelayConfig{Schema: schema, Name: "kafka"}, nil)
	require.NoError(t, err)
	testwait.Until(t, "the relay to reject the row", func() bool {
		_, err := relay.RelayOnce(ctx)
		require.NoError(t, err)
		return relay.Counters().Rejected == 1
	})
	res, err := outboxops.RepublishRejected(ctx, db, schema, outboxops.RepublishRequest{Relay: "kafka", All: true})
	require.NoError(t, err)
	require.Equal(t, 1, res.Republished)
	require.NoError(t, w.PublishTx(ctx, db, topic, message.NewMessage("after-1", []byte("later"))))

	// Two keys, two partitions: the records arrive in either order. A task that fails on the
	// republished row is reported with its trace rather than as a timeout.
	got := map[string]*message.Message{}
	testwait.Until(t, "the republished row and the row written after it", func() bool {
		select {
		case m := <-ch:
			m.Ack()
			got[m.UUID] = m
		default:
			if s, err := client.Status(ctx, cfg.Name); err == nil && len(s.Tasks) > 0 && s.Tasks[0].State.State == "FAILED" {
				t.Fatalf("the connector's task failed after the republish: %.800s", s.Tasks[0].Trace)
			}
		}
		return len(got) == 2
	})
	require.Contains(t, got, "after-1")
	again := got["big-1"]
	require.NotNil(t, again, "the republished row: %v", got)
	require.Equal(t, []byte("a large record"), []byte(again.Payload))
	require.Equal(t, "account-7", again.Metadata.Get("partition_key"))
	s, err := client.Status(ctx, cfg.Name)
	require.NoError(t, err)
	require.True(t, s.Running(), "the connector's task: %+v", s)
}
