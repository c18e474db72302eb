"""The process transport: ProcessLoop (loop.py: shared-memory chunks, the staleness bound,
checkpoints at the child's wait for a version), the child's body (fill.py), the weights both
sides share under a lock (weights.py), and the child process itself (child.py: its heartbeat,
its watch and its end)."""
