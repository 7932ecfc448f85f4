"""pipetrain.hdl."""
