package main

import (
	"cmp"
	"context"
	"errors"
	"fmt"
	"os"
	"slices"
	"strings"
	"time"

	"github.com/ThreeDotsLabs/watermill/message"
	"github.com/twmb/franz-go/pkg/kgo"
	"github.com/twmb/franz-go/pkg/kmsg"

	"github.com/wmonce/watermill-once/broker"
	"github.com/wmonce/watermill-once/outbox"
	"github.com/wmonce/watermill-once/outbox/cdc"
)

// The Debezium path beside the Relay (issue 23): the same end-to-end measurement (producer
// COMMIT -> outbox -> Kafka -> effectively-once commit) with Debezium's connector on the Kafka
// Connect cluster of e2e/services instead of the Relay, at 50 and 1,000 events/s, and a
// burst (rows committed 100 per transaction, as fast as the producers go) through each path.
// Kafka only, on the cluster the Connect workers write to (CONNECT_URL, default
// cdc.DefaultConnectURL; its workers write to 127.0.0.1:9094 with e2e/services):
//
//	KAFKA_BROKERS=127.0.0.1:9094 go run ./e2e/bench -quick -brokers kafka -variants e2e-50,cdc-50,e2e-1000,cdc-1000,burst-relay,burst-cdc
const (
	CDC50      = "cdc-50"
	CDC1000    = "cdc-1000"
	BurstRelay = "burst-relay"
	BurstCDC   = "burst-cdc"
)

// burstBatch is the number of events per producer transaction in a burst variant.
const burstBatch = 100

func init() {
	variantTitles[CDC50] = "end to end at 50 events/s through Debezium on Kafka Connect instead of the Relay (poll.interval.ms=10, exactly-once)"
	variantTitles[CDC1000] = "end to end at 1,000 events/s, as cdc-50"
	variantTitles[BurstRelay] = "burst: rows committed 100 per transaction as fast as possible, Relay -> Kafka -> effectively-once; first commit to last consumer commit"
	variantTitles[BurstCDC] = "burst, as burst-relay, through Debezium"
	latencyVariants = append(latencyVariants, CDC50, CDC1000, BurstRelay, BurstCDC)
	allVariants = append(allVariants, CDC50, CDC1000, BurstRelay, BurstCDC)
}

// viaDebezium reports the variants that forward through Debezium instead of the Relay.
func viaDebezium(id string) bool { return id == CDC50 || id == CDC1000 || id == BurstCDC }

// isBurst reports the burst variants: no schedule, burstBatch events per transaction.
func isBurst(id string) bool { return id == BurstRelay || id == BurstCDC }

// outboxForwarder is what moves the outbox to the broker in an e2e variant: the Relay or Debezium.
type outboxForwarder interface {
	Run(ctx context.Context) error
	Close() error
}

// newForwarder returns the variant's forwarder. Debezium's connector is registered here and
// runs (its slot read by its task) when it returns: events committed before its slot exists
// are never read (snapshot.mode=no_data).
func (h *harness) newForwarder(ctx context.Context, r *rig, id string, pub message.Publisher) (outboxForwarder, error) {
	if !viaDebezium(id) {
		return outbox.NewRelay(h.db, stampingPublisher{pub}, outbox.RelayConfig{Schema: h.opts.schema, Name: "wb-" + r.runID + "-" + id}, h.logger)
	}
	if r.kind != broker.Kafka {
		return nil, errSkip
	}
	client := cdc.Client{URL: cmp.Or(os.Getenv("CONNECT_URL"), cdc.DefaultConnectURL)}
	if _, err := client.Status(ctx, "none"); err != nil && !cdc.IsNotFound(err) {
		h.printf("%-8s %-16s skipped: no Kafka Connect cluster (e2e/services up connect): %v\n", r.label(), id, err)
		return nil, errSkip
	}
	if err := sameKafkaCluster(ctx, client, r.cfg.Kafka.Brokers); err != nil {
		h.printf("%-8s %-16s skipped: %v\n", r.label(), id, err)
		return nil, errSkip
	}
	conn := cdc.Config{Schema: h.opts.schema, DatabaseURL: h.dsn, User: cdc.DefaultReplicationRole, Name: "wb-" + r.runID + "-" + id}.WithDefaults()
	if err := cdc.Prepare(ctx, h.db, conn); err != nil {
		return nil, err
	}
	f := &debeziumForwarder{h: h, client: client, conn: conn, closed: make(chan struct{})}
	if err := client.Apply(ctx, conn); err != nil {
		return nil, err
	}
	deadline := time.Now().Add(h.opts.variantTimeout)
	for {
		s, err := client.Status(ctx, conn.Name)
		slot, serr := cdc.Slot(ctx, h.db, conn)
		if err == nil && serr == nil && s.Running() && slot.Active {
			return f, nil
		}
		if time.Now().After(deadline) || ctx.Err() != nil {
			_ = f.Close()
			return nil, fmt.Errorf("connector %s did not run within %s (status %+v, %w)", conn.Name, h.opts.variantTimeout, s, errors.Join(err, serr))
		}
		time.Sleep(100 * time.Millisecond) // Connect offers no signal: poll its REST API
	}
}

// debeziumForwarder is a registered connector; Close removes it with its slot and publication.
type debeziumForwarder struct {
	h      *harness
	client cdc.Client
	conn   cdc.Config
	closed chan struct{}
}

// Run returns when ctx ends or Close is called, as the Relay's does.
func (f *debeziumForwarder) Run(ctx context.Context) error {
	select {
	case <-ctx.Done():
	case <-f.closed:
	}
	return nil
}

func (f *debeziumForwarder) Close() error {
	close(f.closed)
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	return cdc.Remove(ctx, f.client, f.h.db, f.conn)
}

// burstEvents is the size of a burst variant: -relay-rows.
func (h *harness) burstEvents() int { return h.opts.relayRows }

// producerBatches splits n events into one per transaction, or burstBatch per transaction.
func producerBatches(id string, msgs []*message.Message) [][]*message.Message {
	size := 1
	if isBurst(id) {
		size = burstBatch
	}
	var out [][]*message.Message
	for c := range slices.Chunk(msgs, size) {
		out = append(out, c)
	}
	return out
}

// sameKafkaCluster refuses a Connect cluster whose workers write to another Kafka cluster than
// the one the bench reads (KAFKA_BROKERS, or the embedded kfake): Debezium's records would never
// reach the consumers, and the variant would only wait out its timeout. Two checks, because
// e2e/services formats its 3.9 and 4.x brokers with one cluster ID: the IDs must match, and
// the bench's Kafka must hold a group of protocol type "connect" (every distributed Connect
// cluster's workers form one on their Kafka).
func sameKafkaCluster(ctx context.Context, client cdc.Client, addrs []string) error {
	connectID, err := client.KafkaClusterID(ctx)
	if err != nil {
		return err
	}
	cl, err := kgo.NewClient(kgo.SeedBrokers(addrs...))
	if err != nil {
		return fmt.Errorf("kafka client for %s: %w", strings.Join(addrs, ","), err)
	}
	defer cl.Close()
	ctx, cancel := context.WithTimeout(ctx, 15*time.Second)
	defer cancel()
	fix := fmt.Sprintf("run the Debezium variants with %s set to the Connect cluster's Kafka (127.0.0.1:9094 with e2e/services)", broker.EnvKafkaBrokers)
	meta, err := kmsg.NewPtrMetadataRequest().RequestWith(ctx, cl)
	if err != nil {
		return fmt.Errorf("metadata from %s: %w", strings.Join(addrs, ","), err)
	}
	if meta.ClusterID == nil || *meta.ClusterID != connectID {
		return fmt.Errorf("the Connect workers write to Kafka cluster %s, the bench reads %s (another cluster): %s", connectID, strings.Join(addrs, ","), fix)
	}
	groups, err := kmsg.NewPtrListGroupsRequest().RequestWith(ctx, cl)
	if err != nil {
		return fmt.Errorf("list groups on %s: %w", strings.Join(addrs, ","), err)
	}
	if !slices.ContainsFunc(groups.Groups, func(g kmsg.ListGroupsResponseGroup) bool { return g.ProtocolType == "connect" }) {
		return fmt.Errorf("no Kafka Connect workers' group on %s, so the Connect cluster writes elsewhere: %s", strings.Join(addrs, ","), fix)
	}
	return nil
}
