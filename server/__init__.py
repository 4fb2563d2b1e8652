"""netgain server: a gRPC inference server with per-request phase spans."""
