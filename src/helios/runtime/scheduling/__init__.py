"""Scheduling: admission, queues, slots, policies, step building (`steps`), the scheduler, completion
validation and whole-state invariants. Uses `records` and `cache`."""
