"""One small file per model family: how its config.json reads into ModelConfig's traits, and how
its checkpoint's tensor names map onto the shared decoder's (models/decoder.py)."""
