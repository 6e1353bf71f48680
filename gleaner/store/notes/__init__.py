"""Notes: validating drafts, the one writer (plan, lookup, apply, term index), the same-fact
rule and its words, near-duplicates and topic keys, versions, links, superseding, pinning and
archiving, mem_save sessions, and notes that read as instructions."""
