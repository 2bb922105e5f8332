"""The query-complexity classifier: labelling, training, export (training extras) and the serving
client (tokenizers + tritonclient only). Heavy modules (torch, transformers) are imported lazily
by `training` and `export`, so the client and the policy stay small."""
