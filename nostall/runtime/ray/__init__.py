"""The Ray transport: RayLoop (loop.py: K worker actors, in-order chunks, the staleness bound
across workers, weights once a version), its workers (worker.py), checkpoints
(checkpoints.py), requests lost with a worker and its restart (losses.py), reaching the cluster
(cluster.py), weights by broadcast (collective_weights.py), and the processes a run started
reaped when it ends (reaper.py). Ray itself is imported only when a loop starts."""
