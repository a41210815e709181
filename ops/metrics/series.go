package metrics

import (
	"slices"
	"strings"

	"github.com/prometheus/client_golang/prometheus"
)

// series collects one scrape's samples, merging those with equal name and labels (several
// middlewares serving one consumer, relays without a name) so that each is sent once:
// counters and gauges of amounts are summed, flags and timestamps take the maximum.
type series struct {
	values map[string]*sample
	order  []string
}

type sample struct {
	desc   *prometheus.Desc
	typ    prometheus.ValueType
	labels []string
	value  float64
}

func newSeries() *series { return &series{values: map[string]*sample{}} }

func (s *series) get(d *prometheus.Desc, typ prometheus.ValueType, labels []string) (*sample, bool) {
	// Label values come partly from message metadata (the sender): invalid UTF-8 there must
	// not make the scrape fail.
	for i, l := range labels {
		labels[i] = strings.ToValidUTF8(l, "\uFFFD")
	}
	key := d.String() + "\xff" + strings.Join(labels, "\xff")
	if v, ok := s.values[key]; ok {
		return v, true
	}
	v := &sample{desc: d, typ: typ, labels: slices.Clone(labels)}
	s.values[key] = v
	s.order = append(s.order, key)
	return v, false
}

func (s *series) add(d *prometheus.Desc, typ prometheus.ValueType, v float64, labels ...string) {
	smp, _ := s.get(d, typ, labels)
	smp.value += v
}

func (s *series) max(d *prometheus.Desc, typ prometheus.ValueType, v float64, labels ...string) {
	smp, existed := s.get(d, typ, labels)
	if !existed || v > smp.value {
		smp.value = v
	}
}

func (s *series) flush(ch chan<- prometheus.Metric) {
	for _, key := range s.order {
		v := s.values[key]
		m, err := prometheus.NewConstMetric(v.desc, v.typ, v.value, v.labels...)
		if err != nil {
			m = prometheus.NewInvalidMetric(v.desc, err) // a bug here: reported by Gather, never a panic
		}
		ch <- m
	}
}
