"""What every trainer shares: checkpoints, argument checks, outputs."""
