// Package interop holds no code, only tests: they run watermill-once's middleware
// (once.New, once.Stack), its inbox (inbox.Receiver and Processor)
// and its outbox relay over Pub/Subs that users already run, rather than over the broker
// package's own. The handlers are plain Watermill handlers; nothing in them knows which
// Pub/Sub delivered the message.
//
// # watermill-amqp (github.com/ThreeDotsLabs/watermill-amqp/v2)
//
// watermill-amqp's Subscriber and Publisher work with the middleware and the inbox unchanged,
// against a real RabbitMQ (amqp_test.go). Configure them against its known pitfalls:
//
//   - Publisher confirms are off by default: Publish returns before RabbitMQ has the message,
//     and a message lost then is lost for good. Set Config.Publish.ConfirmDelivery = true on
//     every publisher, above all the one given to outbox.NewRelay: the relay records its
//     position once Publish returns.
//   - Its DefaultMarshaler refuses a delivery carrying a header that is not a string. RabbitMQ
//     adds such headers itself: x-delivery-count (a number) on every redelivery from a quorum
//     queue, x-death (a table) after dead-lettering. The refusal nacks the message, RabbitMQ
//     requeues it, and it loops forever without reaching the handler. Set Config.Marshaler to
//     broker.Marshaler{}, which writes what DefaultMarshaler writes and reads any header.
//   - A nack requeues at once (no delay): a failing message comes straight back, as fast as the
//     handler can fail. Put once.Stack around the handler: Retry re-runs a failed delivery
//     in-process with backoff, each attempt in a new transaction, and permanent failures are
//     parked (PoisonPublisher) and acked, so a nack reaches RabbitMQ only after the retries.
//     A quorum queue with a delivery limit (RabbitMQ 4.0 and later set one by default) drops a
//     message, or dead-letters it, once it was redelivered that often: with immediate requeues
//     a database outage reaches the limit in seconds, so give such queues a dead-letter
//     exchange (x-dead-letter-exchange) and redrive from it.
//   - The Publisher declares no queue: a message published to an exchange that no queue is
//     bound to yet is dropped by RabbitMQ. Declare the consumer group's queue first
//     (Subscriber.SubscribeInitialize, or start the subscriber) before anything is published.
//   - Its reconnect races (ThreeDotsLabs/watermill#693): after a lost connection a binary
//     built with -race can die, and the plain binary has a data race. The broker package's
//     RabbitMQ Pub/Sub (same wire format) does not; see its package documentation for when to
//     prefer which.
//
// These tests need PostgreSQL and RabbitMQ with rabbitmqctl (each test gets a virtual host of
// its own, as in internal/brokertest).
package interop
