"""The queue names, written once: the live harvest queue and the import queue (jobs are
recorded with one of these; the Celery app routes and polls them)."""

LIVE_QUEUE = "harvest"
IMPORT_QUEUE = "import"
