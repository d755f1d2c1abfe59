"""A fault campaign of real processes: an orchestrator, two agents and four jobs
under seeded SIGKILLs and SIGSTOPs, each run checked against the journal and the
jobs' own logs (`python -m tests.faults`; see `campaign`)."""
