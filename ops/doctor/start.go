package doctor

import (
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
		v := 0.0
		if f.Hazard {
			v = 1
		}
		ch <- prometheus.MustNewConstMetric(hazardDesc, prometheus.GaugeValue, v, f.Consumer, f.Source)
		if f.Known {
			h := f.Horizon.Seconds()
			if f.Horizon == Unbounded {
				h = -1
			}
			ch <- prometheus.MustNewConstMetric(horizonDesc, prometheus.GaugeValue, h, f.Consumer, f.Source)
		}
		kept[f.Consumer] = f.KeyKept
	}
	for consumer, d := range kept {
		ch <- prometheus.MustNewConstMetric(keptDesc, prometheus.GaugeValue, d.Seconds(), consumer)
	}
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
	cfg := config.Config
	cfg.Consumers = append([]Consumer(nil), cfg.Consumers...)
	for i := range cfg.Consumers {
		if cfg.Consumers[i].MaxMessageAge == 0 {
			cfg.Consumers[i].MaxMessageAge = maxMessageAge
		}
	}
	rep, err := Check(ctx, cfg)
	if err != nil {
		return rep, err
	}
	if config.Registerer != nil {
		if err := config.Registerer.Register(rep.Collector()); err != nil {
			var already prometheus.AlreadyRegisteredError
			if !errors.As(err, &already) {
				return rep, err
			}
		}
	}
	fields := watermill.LogFields{}
	for i, f := range rep.Findings {
		fields["finding_"+strconv.Itoa(i)] = f.String()
	}
	if len(rep.Hazards()) == 0 {
		logger.Info(rep.Summary(), fields)
		return rep, nil
	}
	logger.Error(rep.Summary(), ErrHazard, fields)
	if config.FailOnHazard {
		return rep, ErrHazard
	}
	return rep, nil
}

// OnceStartCheck returns a once.Config.StartCheck running StartCheck for the middleware's
// consumer (all of config's when it names none) with its MaxMessageAge; with FailOnHazard a
// hazard fails once.New.
func OnceStartCheck(config StartConfig, logger watermill.LoggerAdapter) func(ctx context.Context, consumer string, maxMessageAge time.Duration) error {
	return func(ctx context.Context, consumer string, maxMessageAge time.Duration) error {
		cfg := config
		if consumer != "" {
			cfg.Consumers = nil
			for _, c := range config.Consumers {
				if c.Name == consumer {
					cfg.Consumers = append(cfg.Consumers, c)
				}
			}
			if len(cfg.Consumers) == 0 {
				return fmt.Errorf("doctor: consumer %q is not in the doctor's Consumers: list it with the topics and queues it reads", consumer)
			}
		}
		_, err := StartCheck(ctx, cfg, maxMessageAge, logger)
		return err
	}
}
