"""Jobs: the model's shape, the training settings, the token data, and the fragments Streaming
DiLoCo syncs."""
