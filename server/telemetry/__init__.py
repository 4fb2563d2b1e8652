"""Server telemetry: Prometheus metrics, samplers, the span log and cold-start timings."""
