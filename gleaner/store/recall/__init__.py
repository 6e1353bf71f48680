"""Recall: any-word BM25 search over the store's own postings, note vectors and hybrid
fusion, the index text a system prompt gets, and keeping PostgreSQL's statistics fresh."""
