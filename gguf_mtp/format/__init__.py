"""The GGUF file format: the exact, bounded header codec (the only serializer), KV edits, tensor layout."""
