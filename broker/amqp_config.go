package broker

import (
	"cmp"
	"errors"
	"fmt"
	"net/url"
	"slices"
	"time"

	"github.com/wmonce/watermill-once/internal/setup"
)

// The queue types AMQPConfig.QueueType accepts.
const (
	queueTypeQuorum  = "quorum"
	queueTypeClassic = "classic"
)

// DefaultAMQPURL is AMQPConfig.URL when none is given (a local RabbitMQ), and the fallback of
// programs that take their own -amqp-url.
const DefaultAMQPURL = "amqp://guest:guest@127.0.0.1:5672/"

// The RabbitMQ broker's defaults (AMQPConfig).
const (
	defaultAMQPQueueType = queueTypeQuorum
	defaultAMQPWorkers   = 8
	// defaultAMQPPrefetchPerWorker times Workers is the default Prefetch.
	defaultAMQPPrefetchPerWorker = 4
	defaultAMQPConnectionName    = "watermill-once"
	// defaultAMQPDeliveryLimit is the default AMQPConfig.DeliveryLimit: in effect none (a
	// message failing once a second reaches it after 31 years).
	defaultAMQPDeliveryLimit = 1_000_000_000
)

// Bounds of AMQPConfig.Workers and Prefetch (RabbitMQ's prefetch count is 16 bits).
const (
	maxAMQPWorkers  = 1000
	maxAMQPPrefetch = 65535
)

// AMQPConfig configures Watermill's AMQP Pub/Sub for RabbitMQ.
type AMQPConfig struct {
	// URL of the broker, vhost included. Env AMQP_URL; default DefaultAMQPURL.
	URL string
	// Prefix goes before every exchange and queue name, so applications can share a vhost. Env
	// AMQP_PREFIX; default "".
	Prefix string
	// QueueType is "quorum" (replicated, durable) or "classic"; an existing queue keeps its
	// type. Env AMQP_QUEUE_TYPE; default "quorum".
	QueueType string
	// Workers is how many messages each subscription has in flight (a goroutine each); 1, with
	// Prefetch 1, for queue order. Env AMQP_WORKERS; default 8, at most 1000.
	Workers int
	// Prefetch is how many unacked messages RabbitMQ hands each subscription (docs/brokers.md).
	// Env AMQP_PREFETCH; default 4 x Workers; from Workers to 65535.
	Prefetch int
	// NackDelay is the wait before a nacked message is handed back to RabbitMQ. Default 100ms.
	NackDelay time.Duration
	// ConnectionName is shown in the management UI. Default "watermill-once".
	ConnectionName string
	// DeliveryLimit is the x-delivery-limit of the quorum queues declared here (docs/brokers.md).
	// Default 1,000,000,000: in effect none, where RabbitMQ 4 would apply 20.
	DeliveryLimit int
	// DisableUnroutedQueue stops declaring <Prefix>wmonce.unrouted, which keeps messages
	// published to a topic no queue is bound to: only for exchanges that exist without it.
	DisableUnroutedQueue bool
}

func (a *AMQPConfig) setDefaults() {
	a.URL = cmp.Or(a.URL, DefaultAMQPURL)
	a.QueueType = cmp.Or(a.QueueType, defaultAMQPQueueType)
	a.Workers = cmp.Or(a.Workers, defaultAMQPWorkers)
	a.Prefetch = cmp.Or(a.Prefetch, defaultAMQPPrefetchPerWorker*a.Workers)
	a.NackDelay = cmp.Or(a.NackDelay, defaultNackDelay)
	a.ConnectionName = cmp.Or(a.ConnectionName, defaultAMQPConnectionName)
	a.DeliveryLimit = cmp.Or(a.DeliveryLimit, defaultAMQPDeliveryLimit)
}

// checkAMQPURL refuses a URL that is not amqp:// or amqps:// with a host.
func checkAMQPURL(raw string) error {
	u, err := url.Parse(raw)
	if err != nil || !slices.Contains([]string{"amqp", "amqps"}, u.Scheme) || u.Host == "" {
		return fmt.Errorf("AMQP URL (%s) must look like amqp://user:pass@host:5672/vhost", EnvAMQPURL)
	}
	return nil
}

func (a AMQPConfig) validate() error {
	errs := []error{
		setup.Between("AMQP.Workers", a.Workers, 1, maxAMQPWorkers),
		setup.NotNegative("AMQP.NackDelay", a.NackDelay),
		setup.AtLeast("AMQP.DeliveryLimit", a.DeliveryLimit, 1),
	}
	errs = append(errs, checkAMQPURL(a.URL))
	if !slices.Contains([]string{queueTypeQuorum, queueTypeClassic}, a.QueueType) {
		errs = append(errs, fmt.Errorf("AMQP queue type (%s) %q is not supported: use quorum or classic", EnvAMQPQueueType, a.QueueType))
	}
	if a.Prefix != "" && !amqpName.MatchString(a.Prefix) {
		errs = append(errs, fmt.Errorf("AMQP prefix (%s) %q may only hold letters, digits, '-', '_', '.' and ':'", EnvAMQPPrefix, a.Prefix))
	}
	if a.Prefetch < a.Workers || a.Prefetch > maxAMQPPrefetch {
		errs = append(errs, fmt.Errorf("AMQP.Prefetch must be between Workers (%d) and %d, got %d: fewer would leave consumers idle", a.Workers, maxAMQPPrefetch, a.Prefetch))
	}
	return errors.Join(errs...)
}
