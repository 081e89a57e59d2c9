"""Training: DINO's mechanics, the training loop's resume and reproducibility, resume files that run no code."""
