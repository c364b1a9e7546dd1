"""Process groups and collectives for tensor parallelism (torch.distributed: gloo / NCCL)."""
