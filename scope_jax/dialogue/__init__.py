"""The two-player episode: messages, each role's token view, the batched turn loop, training batches."""
