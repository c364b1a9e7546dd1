"""Vision towers and projectors: an image's processed tensors -> rows of the decoder's input
embeddings (one per placeholder token), one small file per family."""
