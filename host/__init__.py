"""pipetrain.host."""
