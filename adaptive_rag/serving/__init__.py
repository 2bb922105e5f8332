"""The serving use cases, free of gRPC and Celery:

- `admission.AnswerService`: authenticate -> validate -> idempotency -> record -> classify ->
  decide -> enqueue -> wait, plus reading results (`get_result`) and feedback;
- `answering.answer_task`: what a worker does with one task: run the strategy, write the result
  once, return it.

They are written over the small ports in `serving.ports`; the gRPC front door (services/) and the
Celery task (workers/) are thin edges that adapt their transport to these calls.
"""
