"""The lab: the questions asked of the product (harness, experiments, load tests); never imported by the product."""
