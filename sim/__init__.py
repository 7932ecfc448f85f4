"""pipetrain.sim."""
