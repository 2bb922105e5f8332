"""Training the query-complexity classifier: labels from strategy outcomes (`labelling`), live
labels from logged traffic (`relabel`), fine-tuning (`training`, `model`), ONNX export into the
model repository (`export`) and champion/challenger promotion (`promotion`). Needs the `train`
extras (torch, transformers); serving never imports this package."""
