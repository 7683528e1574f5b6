"""The paged history cache: physical pages (`pages`, `page_pool`), the prefix cache
(`prefix_cache`), snapshots (`snapshots`) and the scheduler's cache manager (`cache_manager`).
Uses `records` only."""
