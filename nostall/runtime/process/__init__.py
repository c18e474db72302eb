"""The process transport: ProcessLoop (loop.py: shared-memory chunks and weights, the staleness
bound, checkpoints at the child's wait for a version) and the child it runs the rollout side in
(child.py: its heartbeat, its watch and its end)."""
