"""What every trainer shares: the training loop (loop.py), its result (result.py), what a run
shows and leaves behind (outputs.py), and the checkpoint format (checkpoint.py)."""
