"""Records in a SQL database through SQLAlchemy 2 (SQLite by default, PostgreSQL by URL).

Schema changes go through Alembic (`migrations/`); `upgrade_database(url)` applies them.
"""

from adaptive_rag.storage.db import make_engine, session_factory, upgrade_database
from adaptive_rag.storage.knowledge import KnowledgeRecords
from adaptive_rag.storage.labels import LabelStore
from adaptive_rag.storage.models import (
    ApiKey, Base, Feedback, ModelPromotion, QueryRequest, QueryResult, RoutingDecision, TrainingLabel,
)
from adaptive_rag.storage.promotions import JobBusyError, PromotionRecord, PromotionStore, job_lock
from adaptive_rag.storage.records import ApiKeyView, RecordStore, StoredResult

__all__ = [
    "ApiKey", "ApiKeyView", "Base", "Feedback", "JobBusyError", "KnowledgeRecords", "LabelStore",
    "ModelPromotion", "PromotionRecord", "PromotionStore", "QueryRequest", "QueryResult",
    "RecordStore", "RoutingDecision", "StoredResult", "TrainingLabel",
    "job_lock", "make_engine", "session_factory", "upgrade_database",
]
