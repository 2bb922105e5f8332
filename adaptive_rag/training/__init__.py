"""Training the query-complexity classifier: labels from strategy outcomes (`labelling`), live
labels from logged traffic (`relabel`), fine-tuning (`training`, `model`), ONNX export into the
model repository (`export`), which labels train and which judge (`splits`), champion/challenger
promotion and rollback (`promotion`) and one retraining run under its lock (`retrain`); the
policy's thresholds (`calibration`), the shipped bag-of-words router (`bag_of_words`), the
learned routers of `adaptive_rag.routers` (`learned_routers`) and their sentence encoder
(`encoders`). Needs the `train` extras (torch, transformers) to train and export; serving never
imports this package."""
