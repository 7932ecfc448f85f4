"""pipetrain.compiler."""
