"""The gRPC front door: validate, authenticate, classify, record, enqueue on the tier's queue, wait.

Run it with `python -m services.frontdoor` (or `make frontdoor`).
"""
