"""Text in and out of models: tokenizers, pre-tokenizers, Unicode tables and chat templates."""
