"""The Celery side: the app, its queues and routes, the thin tasks, beat's housekeeping, the
lost-job sweep and the worker's guards (memory, a full Redis, a stalled task)."""
