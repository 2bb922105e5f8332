"""The serving use cases, free of gRPC and Celery, one module per use case around its command
(`commands`: what each use case is asked, and what it answers):

- `admission`: Answer (authenticate -> validate -> classify -> record, the idempotency check ->
  admit -> enqueue -> wait; a resend replays or runs again); `slots` gives fair-share slots back;
- `route`: Route; `results`: GetResult; `feedback`: SubmitFeedback; `upkeep`: expiry, health,
  queue depths;
- `context.Serving`: the ports, settings and per-process state they share; `service.AnswerService`
  the one object the front door holds (a method per use case);
- `answering.answer_task`: what a worker does with one task: run the strategy, write the result
  once, return it.

They are written over the small ports in `serving.ports`; the gRPC front door (services/) and the
Celery task (workers/) are thin edges that adapt their transport to these calls. The adapters
raise the library's errors (`adaptive_rag.errors`), never their driver's.
"""
