"""The forward-pass plumbing beneath the models: ForwardBatch, the KV tensors, attention
backends."""
