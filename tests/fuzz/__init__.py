"""A seeded fuzzer over every RPC of the orchestrator and the agent.

`generate` makes what is sent (valid requests, requests with hostile values,
mutated and random bytes, cut and malformed frames); `fuzzer` sends it to an
in-process Orchestrator and Agent over raw gRPC streams and checks what a caller
and an operator would: no INTERNAL or UNKNOWN status, no call that outlives its
deadline, no traceback logged, short status messages, both servers still serving
and their tables consistent afterwards. `python -m tests.fuzz` runs it longer.
"""
