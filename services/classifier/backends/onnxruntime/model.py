"""A Python-based Triton backend named `onnxruntime`, for the local Triton only.

The `tritonserver` in the `nvidia-pytriton` wheel has just the Python backend. Placed as
`<backend-directory>/onnxruntime/model.py` (Triton's "Python-based backends"), this file lets that
server load the model repository exactly as a production Triton does with its C++ onnxruntime
backend: the same `config.pbtxt` (`backend: "onnxruntime"`, dynamic batching, version policy), the
same `<version>/model.onnx`, EXPLICIT model control with `load_model` / `unload_model`, one
instance per loaded version. It runs the graph with the `onnxruntime` Python package of the
environment the stub runs in (`services/classifier/serve.py` sets it up).

Each execute() gets the requests Triton's dynamic batcher grouped; they are padded to the longest
sequence and run as one ONNX batch. `ARAG_TRITON_ONNX_THREADS` sets ONNX Runtime's intra-op threads.
"""

import json
import os

import numpy as np
import triton_python_backend_utils as pb_utils


class TritonPythonModel:
    def initialize(self, args):
        import onnxruntime as ort

        config = json.loads(args["model_config"])
        self.input_names = [tensor["name"] for tensor in config["input"]]
        self.output_names = [tensor["name"] for tensor in config["output"]]
        path = os.path.join(args["model_repository"], args["model_version"], "model.onnx")
        options = ort.SessionOptions()
        options.intra_op_num_threads = int(os.environ.get("ARAG_TRITON_ONNX_THREADS", "1"))
        options.inter_op_num_threads = 1
        options.graph_optimization_level = ort.GraphOptimizationLevel.ORT_ENABLE_ALL
        self.session = ort.InferenceSession(path, sess_options=options, providers=["CPUExecutionProvider"])

    def execute(self, requests):
        try:
            arrays = [
                [np.atleast_2d(pb_utils.get_input_tensor_by_name(r, name).as_numpy()).astype(np.int64)
                 for name in self.input_names]
                for r in requests
            ]
            width = max(a[0].shape[1] for a in arrays)
            feeds = {
                name: np.concatenate([np.pad(a[i], ((0, 0), (0, width - a[i].shape[1]))) for a in arrays])
                for i, name in enumerate(self.input_names)
            }
            results = self.session.run(self.output_names, feeds)
        except Exception as exc:  # noqa: BLE001 - every request of the batch gets the error
            error = pb_utils.TritonError(f"onnxruntime: {exc}")
            return [pb_utils.InferenceResponse(output_tensors=[], error=error) for _ in requests]
        responses, start = [], 0
        for a in arrays:
            rows = a[0].shape[0]
            tensors = [pb_utils.Tensor(name, result[start:start + rows].astype(np.float32))
                       for name, result in zip(self.output_names, results, strict=True)]
            responses.append(pb_utils.InferenceResponse(output_tensors=tensors))
            start += rows
        return responses

    def finalize(self):
        self.session = None
