"""Runs from elsewhere: real training checkpoints, published models, imported logs and the pretrained benchmark's inputs."""
