"""The locust load test (`make loadtest`, `python -m lab.loadtest`): a gRPC user, query pools, load shapes, a sampler and the report."""
