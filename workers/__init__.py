"""Celery side of the service: the app (`celery_app`), the tier task (`tasks`), dispatch from the
front door (`dispatch`), the tier worker pools (`pools`), and offline jobs (`jobs/`)."""
