package doctor

import (
	"cmp"
	"context"
	"errors"
	"fmt"
	"strconv"
	"time"

	"github.com/ThreeDotsLabs/watermill"
	"github.com/prometheus/client_golang/prometheus"
)

const (
	metricHazard  = "wmonce_redelivery_hazard"
	metricHorizon = "wmonce_redelivery_horizon_seconds"
	metricKeyKept = "wmonce_dedupe_key_retention_seconds"
)

// ErrHazard is StartCheck's error on a hazard (with FailOnHazard).
var ErrHazard = errors.New("doctor: redelivery hazard: a copy can arrive after its key was pruned and be applied again")

// Collector exports the report as the gauges wmonce_redelivery_hazard,
// wmonce_redelivery_horizon_seconds and wmonce_dedupe_key_retention_seconds (docs/operations.md).
func (r Report) Collector() prometheus.Collector { return reportCollector{r} }

type reportCollector struct{ r Report }

var (
	hazardDesc  = prometheus.NewDesc(metricHazard, "1 when a copy from this source can arrive after its key was pruned (applied again), else 0.", []string{"consumer", "source"}, nil)
	horizonDesc = prometheus.NewDesc(metricHorizon, "How old a copy from this source can be when it arrives, in seconds; -1: any age.", []string{"consumer", "source"}, nil)
	keptDesc    = prometheus.NewDesc(metricKeyKept, "How long the consumer's dedupe keys are kept, in seconds.", []string{"consumer"}, nil)
)

func (c reportCollector) Describe(ch chan<- *prometheus.Desc) {
	ch <- hazardDesc
	ch <- horizonDesc
	ch <- keptDesc
}

func (c reportCollector) Collect(ch chan<- prometheus.Metric) {
	kept := map[string]time.Duration{}
	for _, f := range c.r.Findings {
		ch <- prometheus.MustNewConstMetric(hazardDesc, prometheus.GaugeValue, hazardValue(f), f.Consumer, f.Source)
		if f.Known {
			ch <- prometheus.MustNewConstMetric(horizonDesc, prometheus.GaugeValue, horizonSeconds(f.Horizon), f.Consumer, f.Source)
		}
		kept[f.Consumer] = f.KeyKept
	}
	for consumer, d := range kept {
		ch <- prometheus.MustNewConstMetric(keptDesc, prometheus.GaugeValue, d.Seconds(), consumer)
	}
}

// hazardValue is the hazard gauge's value of f: 1 for a hazard, else 0.
func hazardValue(f Finding) float64 {
	if f.Hazard {
		return 1
	}
	return 0
}

// horizonSeconds is the gauge's value of a horizon: -1 for Unbounded.
func horizonSeconds(h time.Duration) float64 {
	if h == Unbounded {
		return -1
	}
	return h.Seconds()
}

// StartConfig configures StartCheck.
type StartConfig struct {
	Config
	Registerer prometheus.Registerer // receives the report's gauges; nil: none
	// FailOnHazard makes StartCheck return ErrHazard on a hazard; default: log it and go on.
	FailOnHazard bool
}

// StartCheck runs Check, logs one line (error on a hazard) and registers the report's gauges.
// A positive maxMessageAge is the age guard of consumers without their own.
func StartCheck(ctx context.Context, config StartConfig, maxMessageAge time.Duration, logger watermill.LoggerAdapter) (Report, error) {
	if logger == nil {
		logger = watermill.NopLogger{}
	}
	rep, err := Check(ctx, withAgeGuard(config.Config, maxMessageAge))
	if err != nil {
		return rep, err
	}
	if err := register(config.Registerer, rep); err != nil {
		return rep, err
	}
	if len(rep.Hazards()) == 0 {
		logger.Info(rep.Summary(), findingFields(rep))
		return rep, nil
	}
	logger.Error(rep.Summary(), ErrHazard, findingFields(rep))
	if config.FailOnHazard {
		return rep, ErrHazard
	}
	return rep, nil
}

// withAgeGuard returns cfg with maxMessageAge as the age guard of the consumers without one
// (cfg's own Consumers are left as they are).
func withAgeGuard(cfg Config, maxMessageAge time.Duration) Config {
	cfg.Consumers = append([]Consumer(nil), cfg.Consumers...)
	for i := range cfg.Consumers {
		cfg.Consumers[i].MaxMessageAge = cmp.Or(cfg.Consumers[i].MaxMessageAge, maxMessageAge)
	}
	return cfg
}

// register registers rep's gauges with reg (nil: none); a collector registered before (an
// earlier start's) is not an error.
func register(reg prometheus.Registerer, rep Report) error {
	if reg == nil {
		return nil
	}
	var already prometheus.AlreadyRegisteredError
	if err := reg.Register(rep.Collector()); err != nil && !errors.As(err, &already) {
		return err
	}
	return nil
}

// findingFields are the log fields of StartCheck's line: each finding in words.
func findingFields(rep Report) watermill.LogFields {
	fields := watermill.LogFields{}
	for i, f := range rep.Findings {
		fields["finding_"+strconv.Itoa(i)] = f.String()
	}
	return fields
}

// named returns the consumers called name.
func named(consumers []Consumer, name string) []Consumer {
	var out []Consumer
	for _, c := range consumers {
		if c.Name == name {
			out = append(out, c)
		}
	}
	return out
}

// OnceStartCheck returns a once.Config.StartCheck running StartCheck for the middleware's
// consumer (all of config's when it names none) with its MaxMessageAge; with FailOnHazard a
// hazard fails once.New.
func OnceStartCheck(config StartConfig, logger watermill.LoggerAdapter) func(ctx context.Context, consumer string, maxMessageAge time.Duration) error {
	return func(ctx context.Context, consumer string, maxMessageAge time.Duration) error {
		cfg := config
		if consumer != "" {
			if cfg.Consumers = named(config.Consumers, consumer); len(cfg.Consumers) == 0 {
				return fmt.Errorf("doctor: consumer %q is not in the doctor's Consumers: list it with the topics and queues it reads", consumer)
			}
		}
		_, err := StartCheck(ctx, cfg, maxMessageAge, logger)
		return err
	}
}
