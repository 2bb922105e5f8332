"""`python -m services.demo`: the real service on embedded defaults, end to end through gRPC."""
