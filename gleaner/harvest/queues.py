"""The queue names, written once: the live harvest queue and the import queue (jobs are
recorded with one of these; the Celery app routes and polls them), and the queue of the
embedding tasks that give new notes their vectors (semantic recall)."""

LIVE_QUEUE = "harvest"
IMPORT_QUEUE = "import"
EMBED_QUEUE = "embed"
