"""KServe v2 REST (the Open Inference Protocol over HTTP) beside gRPC: its bodies and its endpoint."""
