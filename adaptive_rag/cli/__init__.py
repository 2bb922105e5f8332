"""`arag`: index a knowledge base, ask a question, evaluate strategies, measure retrieval; label,
train, export and promote the routing classifier; manage API keys and tenants' knowledge bases.

The commands live in the modules of this package (`answering`, `evaluation`, `classifier`,
`model`, `keys`, `kb`, `reader`, `routers`, `smalltalk`); they import `common`, never this module,
which assembles them into one Typer `app`. Heavy libraries (torch, transformers, matplotlib)
are imported inside the commands that need them.
"""

from __future__ import annotations

import typer

from adaptive_rag.cli import answering, capacity, classifier, evaluation, kb, keys, model, reader, routers, smalltalk
from adaptive_rag.cli.common import run_app

app = typer.Typer(
    add_completion=False, no_args_is_help=True, help=__doc__.split("\n\n")[0],
    pretty_exceptions_enable=False,
)

app.command()(answering.index)
app.command()(answering.ask)
app.command(name="eval")(evaluation.evaluate)
app.command(name="retrieval-bench")(evaluation.retrieval_bench)
app.command()(answering.demo)
app.command()(capacity.capacity)
app.add_typer(classifier.classifier_app, name="classifier", help="label, train, export, calibrate, route")
# The classifier's everyday jobs also answer at the top level (`arag label`, as the docs name them).
for _name in classifier.TOP_LEVEL:
    app.command(name=_name)(getattr(classifier, _name))
app.add_typer(model.model_app, name="model", help="classifier model versions: bootstrap, promote, rollback, status")
app.add_typer(keys.keys_app, name="keys", help="API keys of tenants: create, list, revoke")
app.add_typer(reader.reader_app, name="reader", help="embedded readers: list, fetch, assemble")
app.add_typer(kb.kb_app, name="kb", help="tenants' knowledge bases: import, describe, delete")
app.add_typer(routers.routers_app, name="routers", help="learned routers (lr, knn, reward): train, route, fetch-base")
app.add_typer(smalltalk.smalltalk_app, name="smalltalk", help="the learned small-talk detector: train, try")


def main() -> None:
    """Entry point (`arag`): library errors become one clear line and exit code 2."""
    run_app(app)


__all__ = ["app", "main"]
