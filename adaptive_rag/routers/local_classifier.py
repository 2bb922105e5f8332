"""An exported classifier version run in-process through ONNX Runtime: the same numbers as Triton,
no server needed (evaluation rows, promotion's comparison on held-out labels, tenant priors)."""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np

from adaptive_rag.contracts import CLASSIFIER_INPUTS, CLASSIFIER_OUTPUT, RoutingDecision
from adaptive_rag.routing.classifier_client import QueryTokenizer, softmax_rows
from adaptive_rag.routing.model_repository import ModelVersion
from adaptive_rag.routing.policy import RoutingPolicy


class LocalOnnxClassifier:
    """An exported model version run in-process: tokenize -> ONNX Runtime -> softmax -> policy."""

    def __init__(self, version: ModelVersion, policy: RoutingPolicy | None = None, threads: int = 1) -> None:
        import onnxruntime as ort

        options = ort.SessionOptions()
        options.intra_op_num_threads = threads
        self.session = ort.InferenceSession(
            str(version.onnx_path), options, providers=["CPUExecutionProvider"]
        )
        self.tokenize = QueryTokenizer(version.tokenizer_path, version.max_length)
        self.policy = policy or RoutingPolicy(version.thresholds())
        self.version = version

    def probabilities(self, queries: Sequence[str]) -> np.ndarray:
        ids, mask = self.tokenize(queries)
        logits = self.session.run([CLASSIFIER_OUTPUT], dict(zip(CLASSIFIER_INPUTS, (ids, mask))))[0]
        return softmax_rows(logits)

    def classify(self, query: str) -> RoutingDecision:
        return self.policy.decide(
            self.probabilities([query])[0].tolist(), self.version.name, self.version.version
        )

    route = __call__ = classify
