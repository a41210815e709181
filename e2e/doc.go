// Package e2e is the end-to-end fault suite of watermill-once: one reusable function, Run, that
// checks the effectively-once guarantee over a real broker while faults are injected (relay
// crashes between publishing and recording its position, consumer processes killed with
// SIGKILL, PostgreSQL connections terminated, broker connections closed, a poison message), in
// the spirit of Watermill's tests.TestPubSub. e2e_test.go runs it for Kafka, RabbitMQ and the
// SQL Pub/Sub.
//
// Running it needs PostgreSQL (DATABASE_URL), RabbitMQ with rabbitmqctl on this machine
// (AMQP_URL; each test gets a virtual host of its own), and either KAFKA_BROKERS or nothing
// (an embedded kfake broker is started in the test process; the consumer processes connect to
// it over TCP). The default run is a few hundred events per broker; E2E_SOAK=1 runs a longer
// soak (E2E_EVENTS overrides the count).
package e2e
