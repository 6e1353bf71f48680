"""The pipeline's records: queued jobs and their leases, what was harvested (the ledger),
per-transcript advisory locks, job reports and status, and the daily budgets' spend."""
