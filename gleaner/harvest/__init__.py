"""Transcripts in, notes out: the readers, the privacy pass over a transcript, the harvest model
and the one job that writes what it keeps through the store. Never imports Celery."""
