"""The lab's shared harness: one local stack, one backing-service harness, one load client, one statistics module, the instant LLM."""
