"""The two-player episode: messages, each role's token view, speakers and the batched turn loop."""
