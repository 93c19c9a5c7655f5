"""`pyggml serve`: OpenAI's HTTP API on the batching engine (app: routes; completions, embeddings, audio: the
endpoints' work; protocol, params, tool_calls, constraints: reading requests; state, metrics: the server's own)."""
