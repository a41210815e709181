// Package metrics exports watermill-once's figures to Prometheus.
package metrics
