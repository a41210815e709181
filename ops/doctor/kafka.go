package doctor

import (
	"context"
	"fmt"
	"strconv"
	"strings"
	"time"

	"github.com/IBM/sarama"
)

// KafkaConfig reaches a Kafka cluster's configuration.
type KafkaConfig struct {
	Brokers []string // the bootstrap addresses
	// Sarama is the client configuration (TLS, SASL). Default: sarama.NewConfig(), protocol 2.1.
	Sarama *sarama.Config
}

type kafkaReader struct {
	cfg   KafkaConfig
	admin sarama.ClusterAdmin
	err   error

	brokerRead    bool
	offsetsMinute int64 // offsets.retention.minutes; -1 unknown
	brokerDetail  string
}

func newKafkaReader(cfg KafkaConfig) *kafkaReader {
	sc := cfg.Sarama
	if sc == nil {
		sc = sarama.NewConfig()
		sc.Version = sarama.V2_1_0_0
		sc.ClientID = "wmonce-doctor"
		sc.Net.DialTimeout = 5 * time.Second
		sc.Admin.Timeout = 10 * time.Second
	}
	r := &kafkaReader{cfg: cfg, offsetsMinute: -1}
	r.admin, r.err = sarama.NewClusterAdmin(cfg.Brokers, sc)
	if r.err != nil {
		r.err = fmt.Errorf("connect to Kafka at %s: %w", strings.Join(cfg.Brokers, ","), r.err)
	}
	return r
}

func (r *kafkaReader) close() {
	if r.admin != nil {
		_ = r.admin.Close()
	}
}

// brokerConfig reads offsets.retention.minutes of one broker of the cluster.
func (r *kafkaReader) brokerConfig() {
	if r.brokerRead {
		return
	}
	r.brokerRead = true
	brokers, _, err := r.admin.DescribeCluster()
	if err != nil || len(brokers) == 0 {
		r.brokerDetail = fmt.Sprintf("broker offsets.retention.minutes unread (DescribeCluster: %v)", err)
		return
	}
	entries, err := r.describe(sarama.ConfigResource{Type: sarama.BrokerResource, Name: strconv.Itoa(int(brokers[0].ID())), ConfigNames: []string{"offsets.retention.minutes"}})
	if err != nil {
		r.brokerDetail = fmt.Sprintf("broker offsets.retention.minutes unread: %v", err)
		return
	}
	value, ok := configValues(entries)["offsets.retention.minutes"]
	if !ok {
		return
	}
	if v, err := strconv.ParseInt(value, 10, 64); err == nil {
		r.offsetsMinute = v
	}
	r.brokerDetail = fmt.Sprintf("broker offsets.retention.minutes=%s (%s): a group idle that long loses its offsets and restarts from its reset policy; from the oldest offset it replays the whole topic",
		value, time.Duration(r.offsetsMinute)*time.Minute)
}

// configValues maps configuration entries by name.
func configValues(entries []sarama.ConfigEntry) map[string]string {
	vals := map[string]string{}
	for _, e := range entries {
		vals[e.Name] = e.Value
	}
	return vals
}

// describe reads the configuration entries of one resource.
func (r *kafkaReader) describe(res sarama.ConfigResource) ([]sarama.ConfigEntry, error) {
	results, err := r.admin.DescribeConfigs([]*sarama.ConfigResource{&res}, sarama.DescribeConfigsOptions{})
	if err != nil {
		return nil, err
	}
	var entries []sarama.ConfigEntry
	for _, res := range results {
		if res.ErrorCode != sarama.ErrNoError {
			return nil, fmt.Errorf("%w: %s", res.ErrorCode, res.ErrorMsg)
		}
		entries = append(entries, res.Configs...)
	}
	return entries, nil
}

// topicRetention is how long topic keeps a message under its cleanup.policy and retention.ms
// (Unbounded: forever), and the setting that bounds it when it is not retention.ms.
func topicRetention(topic, policy string, ms int64) (time.Duration, string) {
	switch {
	case strings.Contains(policy, "compact") && !strings.Contains(policy, "delete"):
		return Unbounded, "cleanup.policy of topic " + topic + " (compact keeps each key's last message forever: add delete, cleanup.policy=compact,delete, with its retention.ms)"
	case ms < 0:
		return Unbounded, ""
	}
	return time.Duration(ms) * time.Millisecond, ""
}

// topicHorizon reads retention.ms, retention.bytes and cleanup.policy of topic.
func (r *kafkaReader) topicHorizon(_ context.Context, topic string) horizon {
	h := horizon{source: "kafka topic " + topic}
	if r.err != nil {
		h.details = []string{r.err.Error()}
		return h
	}
	r.brokerConfig()
	entries, err := r.describe(sarama.ConfigResource{Type: sarama.TopicResource, Name: topic,
		ConfigNames: []string{"retention.ms", "retention.bytes", "cleanup.policy"}})
	if err != nil {
		h.details = []string{fmt.Sprintf("DescribeConfigs of topic %s: %v", topic, err)}
		return h
	}
	vals := configValues(entries)
	ms, err := strconv.ParseInt(vals["retention.ms"], 10, 64)
	if err != nil {
		h.details = []string{fmt.Sprintf("topic %s: retention.ms %q unreadable", topic, vals["retention.ms"])}
		return h
	}
	h.known = true
	policy := vals["cleanup.policy"]
	h.horizon, h.setting = topicRetention(topic, policy, ms)
	h.details = []string{fmt.Sprintf("topic %s: retention.ms=%s retention.bytes=%s cleanup.policy=%s (an offset reset replays messages up to that age; retention.bytes may drop them sooner, never later)",
		topic, vals["retention.ms"], vals["retention.bytes"], policy)}
	if r.brokerDetail != "" {
		h.details = append(h.details, r.brokerDetail)
	}
	return h
}
