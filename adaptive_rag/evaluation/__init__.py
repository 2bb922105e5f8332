"""Evaluation harness: benchmark loaders, the shared corpus, the split, metrics, runs, reports."""
