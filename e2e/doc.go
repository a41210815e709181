// Package e2e is the end-to-end fault suite of watermill-once, in the spirit of Watermill's
// tests.TestPubSub: reusable functions, run once per broker (Kafka, RabbitMQ and the SQL
// Pub/Sub) by e2e_test.go and chaos_test.go.
//
// Run checks the effectively-once guarantee over a real broker while faults are injected at
// fixed points (relay crashes between publishing and recording its position, consumer processes
// killed with SIGKILL, PostgreSQL connections terminated, broker connections closed, a poison
// message). Of its two consumer processes, b runs the ledger as a batch handler
// (once.BatchHandler, E2E_HANDLER=batch), a as a per-message one; RunChaos does the same. On KAFKA_BROKERS the Kafka run also kills the broker process with SIGKILL
// mid-stream and starts it again through e2e/services, so it needs KAFKA_SERVICE, the line
// of that broker there: KAFKA_BROKERS=127.0.0.1:9092 KAFKA_SERVICE=3.9, or
// KAFKA_BROKERS=127.0.0.1:9094 KAFKA_SERVICE=4 (it fails when KAFKA_SERVICE is missing, and on
// kfake its BrokerSIGKILL subtest is skipped). It holds the cluster exclusively while it runs:
// other Kafka tests on KAFKA_BROKERS, in any test binary on the machine, wait for it
// (internal/brokertest). It is part of the ordinary test run: a few hundred events per broker;
// E2E_SOAK=1 runs a longer soak (E2E_EVENTS overrides the count).
//
// RunChaos is the chaos mode: the producers, the real outbox.Relay and two consumer instances
// are separate OS processes (commands under internal/), and a seeded nemesis injects faults at
// random intervals for the whole run: SIGKILL of either consumer and of the relay (which also
// kills itself right after a publish, before its position update), an immediate-mode
// PostgreSQL restart, pg_terminate_backend of every application connection, a broker node
// restart (Kafka: SIGKILL of the broker process; RabbitMQ: stop_app/start_app) and a broker
// connection close (RabbitMQ). Each run logs one "e2e chaos report: {json}" line and fails
// unless every fault hit its minimum (3 consumer kills, 2 relay kills, 1 PostgreSQL restart,
// 1 broker restart, ...) and at least 10% of the events were published more than once. It
// restarts PostgreSQL and the brokers, so it runs only when asked and alone: E2E_CHAOS=ci
// (about 3,000 events per broker; CI runs sql, kafka on the real 3.9 broker and amqp after the
// other tests) or E2E_CHAOS=long (20,000 per broker; the reports are kept in e2e/results/).
// E2E_CHAOS_SEED replays a run's nemesis. The Kafka pass holds the cluster exclusively, like
// the broker-kill fault of Run. E2E_LOG_DIR keeps every process log of either mode for a
// post-mortem; on Kafka they include Sarama's log (consumers, relay, and the test process).
//
// Running either needs PostgreSQL (DATABASE_URL), RabbitMQ with rabbitmqctl on this machine
// (AMQP_URL; each test gets a virtual host of its own), and either KAFKA_BROKERS or nothing (an
// embedded kfake broker is started in the test process; the consumer processes connect to it
// over TCP). The chaos mode needs the real Kafka broker and the project's e2e/services (for
// pg-crash, kafka-kill and kafka-start): KAFKA_BROKERS and KAFKA_SERVICE (3.9 or 4).
package e2e
