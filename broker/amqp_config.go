package broker

import (
	"cmp"
	"errors"
	"fmt"
	"net/url"
	"time"

	"github.com/wmonce/watermill-once/internal/setup"
)

// The queue types AMQPConfig.QueueType accepts.
const (
	queueTypeQuorum  = "quorum"
	queueTypeClassic = "classic"
)

// DefaultAMQPURL is AMQPConfig.URL when none is given: a local RabbitMQ's default vhost and
// user, the URL programs that take their own -amqp-url fall back to as well.
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
	// Prefix is put in front of every exchange and queue name this package declares, so several
	// applications (or test runs) can share a vhost. Env AMQP_PREFIX; default "".
	Prefix string
	// QueueType is "quorum" (replicated, durable; RabbitMQ's recommended type since 3.8) or
	// "classic". Env AMQP_QUEUE_TYPE; default "quorum". An existing
	// queue keeps the type it was declared with; declaring it with another type fails with
	// PRECONDITION_FAILED.
	QueueType string
	// Workers is how many goroutines each subscription (each Subscribe call) runs, one message
	// in flight each: a router handler runs that many messages at once (with the
	// effectively-once middleware, each holds a pool connection). Env AMQP_WORKERS; default
	// 8. Set 1 (AMQP_WORKERS=1 AMQP_PREFETCH=1) for one message at a time
	// in queue order (see Prefetch for what still reorders then).
	Workers int
	// Prefetch is how many unacknowledged messages RabbitMQ hands each subscription: the ones
	// in flight plus the ones waiting in this process, so the next message is here when one is
	// acked instead of a round trip later. Everything prefetched is redelivered if the consumer
	// dies. Env AMQP_PREFETCH; default 4 x Workers (32); at least Workers. With Prefetch > 1
	// (even at Workers 1), a nacked or unacked message comes back after messages that were
	// behind it.
	Prefetch int
	// NackDelay is the wait before a nacked message is handed back to RabbitMQ, which requeues
	// it at once. Default 100ms.
	NackDelay time.Duration
	// ConnectionName is shown in the management UI and rabbitmqctl. Default
	// "watermill-once".
	ConnectionName string
	// DeliveryLimit is the x-delivery-limit of the quorum queues this package declares: how
	// many times RabbitMQ delivers a message (each nack requeues it) before it dead-letters it
	// (to a dead-letter exchange set by policy) or drops it. Default 1,000,000,000: in effect
	// none, where RabbitMQ 4 would apply 20 (docs/brokers.md). A queue that exists with another
	// limit keeps it, with a warning. Classic queues have no delivery limit.
	DeliveryLimit int
	// DisableUnroutedQueue stops declaring the alternate exchange and queue
	// <Prefix>wmonce.unrouted, where RabbitMQ puts messages published to a topic that no queue
	// is bound to (instead of dropping them). Only disable it if the exchanges already exist
	// without the alternate-exchange argument.
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

func (a AMQPConfig) validate() error {
	errs := []error{
		setup.Between("AMQP.Workers", a.Workers, 1, maxAMQPWorkers),
		setup.NotNegative("AMQP.NackDelay", a.NackDelay),
		setup.AtLeast("AMQP.DeliveryLimit", a.DeliveryLimit, 1),
	}
	u, err := url.Parse(a.URL)
	if err != nil || (u.Scheme != "amqp" && u.Scheme != "amqps") || u.Host == "" {
		errs = append(errs, fmt.Errorf("AMQP URL (%s) must look like amqp://user:pass@host:5672/vhost", EnvAMQPURL))
	}
	if a.QueueType != queueTypeQuorum && a.QueueType != queueTypeClassic {
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
