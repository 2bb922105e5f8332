"""`AnswerService`: the one object an edge holds; one method per use case, each running that use
case's handler module over the shared `Serving` state (ports, settings, caches, threads)."""

from __future__ import annotations

from adaptive_rag.serving import admission, feedback, results, route, upkeep
from adaptive_rag.serving.commands import Answer, Answered, GetResult, Route, Routed, SubmitFeedback
from adaptive_rag.serving.context import CallProgress, Serving


class AnswerService(Serving):
    """The front door's use cases over the ports (see `Serving` for what they share)."""

    async def answer(self, command: Answer, progress: CallProgress) -> Answered:
        return await admission.answer(self, command, progress)

    async def route(self, command: Route, progress: CallProgress) -> Routed:
        return await route.route(self, command, progress)

    async def get_result(self, command: GetResult, progress: CallProgress) -> Answered:
        return await results.get_result(self, command, progress)

    async def submit_feedback(self, command: SubmitFeedback, progress: CallProgress) -> int:
        return await feedback.submit_feedback(self, command, progress)

    async def relay_unpublished(self) -> list[str]:
        return await upkeep.relay_unpublished(self)

    async def republish_lost(self) -> list[str]:
        return await upkeep.republish_lost(self)

    async def expire_stale(self) -> list[str]:
        return await upkeep.expire_stale(self)

    async def drop_revoked_keys(self) -> bool:
        return await upkeep.drop_revoked_keys(self)

    async def dependency_problems(self) -> list[str]:
        return await upkeep.dependency_problems(self)

    async def queue_depths(self, queues: list[str]) -> dict[str, int]:
        return await upkeep.queue_depths(self, queues)
