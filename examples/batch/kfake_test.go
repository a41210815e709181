package main

import (
	"github.com/wmonce/watermill-once/internal/brokertest"
	"github.com/wmonce/watermill-once/internal/embeddedkafka"
)

// With KAFKA_BROKERS unset, this module's Kafka tests run on the embedded kfake broker.
func init() { brokertest.StartEmbeddedKafka = embeddedkafka.StartAddrs }
