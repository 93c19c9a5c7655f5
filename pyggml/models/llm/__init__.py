"""Language models at run time: the Model API, the graph runner, the KV cache, batches, sampling and the engine."""
