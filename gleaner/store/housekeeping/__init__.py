"""Housekeeping beat runs: recency decay and duplicate merging, with their shared state
(advisory lock, watermark, last result)."""
