package main

import (
	"testing"

	amqp "github.com/rabbitmq/amqp091-go"
	"github.com/stretchr/testify/require"

	"github.com/wmonce/watermill-once/internal/brokertest"
)

func TestDoctorExitsNonZeroOnAHazard(t *testing.T) {
	amqpURL := brokertest.AMQPVhost(t)
	conn, err := amqp.Dial(amqpURL)
	require.NoError(t, err)
	ch, err := conn.Channel()
	require.NoError(t, err)
	_, err = ch.QueueDeclare("sms", true, false, false, false, nil) // no TTL: keeps copies forever
	require.NoError(t, err)
	_, err = ch.QueueDeclare("rewards", true, false, false, false, amqp.Table{"x-message-ttl": int32(3600_000)})
	require.NoError(t, err)
	require.NoError(t, conn.Close())

	r := wmonceRaw(t, "doctor", "-amqp-url", amqpURL, "-keep", "7d", "-consumer", "sms", "-amqp", "sms", "-consumer", "rewards", "-amqp", "rewards")
	t.Log(r.stdout, r.stderr)
	require.Equal(t, exitFailure, r.code)
	require.Contains(t, r.stdout, "HAZARD: consumer sms, rabbitmq queue sms")
	require.Contains(t, r.stdout, "ok: consumer rewards, rabbitmq queue rewards")
	require.Contains(t, r.stdout, "REDELIVERY HAZARD on 1 of 2")
	require.Contains(t, r.stderr, "set what the HAZARD lines say")

	// The age guard covers it: safe, exit 0.
	r = wmonceRaw(t, "doctor", "-amqp-url", amqpURL, "-consumer", "sms", "-amqp", "sms", "-max-message-age", "6d")
	require.Equal(t, exitOK, r.code, r.stdout+r.stderr)
	require.Contains(t, r.stdout, "no redelivery hazard")

	r = wmonceRaw(t, "doctor", "-json", "-amqp-url", amqpURL, "-consumer", "sms", "-amqp", "sms")
	require.Equal(t, exitFailure, r.code)
	require.Contains(t, r.stdout, `"hazards": 1`)
}

func TestDoctorUsageErrors(t *testing.T) {
	t.Parallel()
	for _, tc := range []struct {
		args []string
		want string
	}{
		{[]string{"doctor", "-kafka", "t"}, "give -consumer NAME before it"},
		{[]string{"doctor", "-consumer", "c", "-max-message-age", "soon"}, "is not an age"},
		{[]string{"doctor", "-consumer", "c", "-keep", "5s"}, "shorter than the janitor accepts"},
		{[]string{"doctor", "-kafka-brokers", "", "-consumer", "c", "-kafka", "t"}, "give -kafka-brokers"},
	} {
		r := wmonceRaw(t, tc.args...)
		require.Equal(t, exitUsage, r.code, "%v: %s", tc.args, r.stderr)
		require.Contains(t, r.stderr, tc.want, "%v", tc.args)
	}
}
